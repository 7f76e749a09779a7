"""Stick-breaking attention (Tan et al., 2024, arXiv:2410.17980).

flash-linear-attention's ``StickBreakingAttention`` layer: ``q = x W_q``
with ``H`` heads, ``k = x W_k`` and ``v = x W_v`` with ``Hkv`` heads
(grouped-query attention), head width ``D / H``, optionally an RMSNorm of
each query and key head (``qk_norm``, one scale of ``D / H`` shared by the
heads), then

    A_ij = sigmoid(z_ij) prod_{j < l < i} (1 - sigmoid(z_il)),
    z = q k^T / sqrt(D / H),   o_i = sum_j A_ij v_j,   y = o W_o,

with ``j <= l`` and ``j <= i`` under ``attend_current``. There is no
softmax and no position encoding (no RoPE): the stick, broken from the
nearest key backwards, orders the keys. fla's layer adds nothing for the
stick a query leaves unused (its op returns it; the layer drops it), and
neither does this one. Projections are LeCun normal (fla's models draw
``N(0, 0.02)``), with biases on q, k and v when ``qkv_bias``; the output
projection has none.

The forms of every mode:

- no cache, ``"chunk"``: the blockwise op (never ``[T, T]``, linear memory
  both ways);
- no cache, ``"parallel"``: the dense definition;
- ``"recurrent"``: a ``lax.scan`` of one-token KV-cache steps over a fresh
  cache (or over the given one);
- with a cache, ``T > 1`` in ``"chunk"`` or ``"parallel"``: the new tokens
  are appended with ``stickbreaking_attn_extend`` (they see the cached
  entries and each other); ``T = 1``: one step.

The cache is the softmax family's full ``KVCache`` of ``max_len`` entries
(keys, values, the position of every entry); fla's layer has none (it
refuses ``use_cache``). A step breaks the stick over every cached key of
its document, so it costs ``O(max_len)``, as full attention's does.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer
from lin_attn_jax.layers.softmax import head_layout, scan_steps
from lin_attn_jax.ops import (chunk_stickbreaking_attn, init_kv_cache,
                              parallel_stickbreaking_attn,
                              stickbreaking_attn_extend,
                              stickbreaking_attn_step)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.stickbreaking_attn.inputs import check_attend_current


class StickBreakingAttention(Mixer):
  """Causal stick-breaking attention with optional grouped key/value heads.

  Args:
    d_model: ``D``. n_heads: ``H``; the head width is ``D / H``.
    n_kv_heads: ``Hkv``, key/value heads, a divisor of ``H``; None for
      ``H`` (fla's ``num_kv_heads``).
    qkv_bias: biases on the q, k and v projections (False, as fla).
    qk_norm: an RMSNorm of every query and key head (False, as fla).
    attend_current: a query also sees its own key (False, as fla: a
      document's first token then outputs 0).
    norm_eps: epsilon of the q/k RMSNorm (1e-6, as fla).
    block_size: query and key positions per block of the chunk form (speed
      only; 64, fla's kernel's query block).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               n_kv_heads: int | None = None, qkv_bias: bool = False,
               qk_norm: bool = False, attend_current: bool = False,
               norm_eps: float = 1e-6, block_size: int = 64,
               dtype=jnp.float32, param_dtype=jnp.float32):
    check_attend_current(attend_current)
    checks.positive_int("block_size", block_size)
    self.n_kv_heads, self.head_dim = head_layout(d_model, n_heads, n_kv_heads)
    self.n_heads, self.attend_current = n_heads, attend_current
    self.block_size = block_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    q_dim, kv_dim = n_heads * self.head_dim, self.n_kv_heads * self.head_dim
    self.q_proj = modules.dense(d_model, q_dim, use_bias=qkv_bias, **kw)
    self.k_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.v_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.o_proj = modules.dense(q_dim, d_model, ("heads", "embed"), **kw)
    norm = lambda: modules.rms_norm(self.head_dim, axis_name=None,
                                    eps=norm_eps, **kw)
    self.q_norm = norm() if qk_norm else None
    self.k_norm = norm() if qk_norm else None

  def init_mixer_cache(self, batch_size, max_len, dtype):
    return init_kv_cache(batch_size, self.n_kv_heads, self.head_dim,
                         self.head_dim, max_length=max_len, dtype=dtype)

  def recurrent_state_floats(self, seq_len):
    """The keys and values of the KV cache, ``2 x T x Hkv x head_dim``."""
    return 2 * seq_len * self.n_kv_heads * self.head_dim

  def attend(self, q, k, v, ctx: Context):
    """``o [B, T, H, V]`` of a call without a cache in chunk or parallel
    mode."""
    options = dict(attend_current=self.attend_current,
                   segment_ids=ctx.segment_ids)
    if ctx.mode == "chunk":
      return chunk_stickbreaking_attn(q, k, v, block_size=self.block_size,
                                      **options)
    return parallel_stickbreaking_attn(q, k, v, **options)

  def token_by_token(self, q, k, v, cache, ctx: Context):
    """One-token steps scanned over T; a token resets where its document
    starts. Returns ``(o [B, T, H, V], cache)``."""
    return scan_steps(
        lambda cache, reset, **token: stickbreaking_attn_step(
            **token, cache=cache, attend_current=self.attend_current,
            reset=reset),
        dict(q=q, k=k, v=v), cache, ctx.segment_ids, ctx.restart)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    hd = self.head_dim
    q = self.q_proj(x).reshape(b, t, self.n_heads, hd)          # [B, T, H, K]
    k = self.k_proj(x).reshape(b, t, self.n_kv_heads, hd)       # [B, T, Hkv, K]
    v = self.v_proj(x).reshape(b, t, self.n_kv_heads, hd)       # [B, T, Hkv, V]
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    cache = ctx.cache
    # o_i = sum_j sigmoid(z_ij) prod_{j < l < i} (1 - sigmoid(z_il)) v_j
    if ctx.decoding:
      o, cache = stickbreaking_attn_step(
          q[:, 0], k[:, 0], v[:, 0], cache,
          attend_current=self.attend_current, reset=ctx.restart)
      o = o[:, None]
    elif ctx.mode == "recurrent":
      o, scanned = self.token_by_token(
          q, k, v, self.init_mixer_cache(b, t, k.dtype) if cache is None
          else cache, ctx)
      cache = None if cache is None else scanned
    elif cache is not None:
      o, cache = stickbreaking_attn_extend(
          q, k, v, cache, attend_current=self.attend_current,
          segment_ids=ctx.segment_ids, reset=ctx.restart)
    else:
      o = self.attend(q, k, v, ctx)
    y = self.o_proj(o.reshape(b, t, self.n_heads * hd))         # [B, T, D]
    return y, cache
