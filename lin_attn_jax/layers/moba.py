"""MoBA, mixture of block attention (Lu et al., 2025, "MoBA: Mixture of
Block Attention for Long-Context LLMs", arXiv:2502.13189), as
flash-linear-attention's ``MoBA`` layer.

``q = x W_q`` with ``H`` heads, ``k = x W_k`` and ``v = x W_v`` with ``Hkv``
heads, head width ``D / H``; optionally an RMSNorm of each head of ``q``
and ``k`` (``qk_norm``, eps 1e-5); RoPE on ``q`` and ``k`` at absolute
positions (MoBA's gates ``q . mean(k_block)`` and its scores depend only
on the distances, so a document packed after others scores as it would
alone); ``o = MoBA(q, k, v)`` (``lin_attn_jax.ops.moba``: each query
attends to its own block and the ``top_k - 1`` earlier blocks of largest
gate); an RMSNorm of each head of ``o`` (one scale of head width for all
heads, eps 1e-6), times ``sigmoid(x W_g1 W_g2)`` with ``use_output_gate``
(a rank-``D / H`` gate); ``y = o W_o``. Projections start LeCun normal (fla
models draw ``N(0, 0.02)``).

The forms of every mode:

- no cache, ``"chunk"``: ``chunk_moba`` (blockwise, never ``[T, T]``);
- no cache, ``"parallel"``: ``parallel_moba``, the definition;
- ``"recurrent"``: ``moba_step`` scanned over a fresh cache (or the given
  one);
- with a cache, ``T > 1``: ``moba_extend``; ``T = 1``: ``moba_step``.

fla's layer decodes with dense attention over its KV cache (the paper's
switch to full attention for generation, its Sec. 3.3); here decoding runs
MoBA itself, from the cached keys, values and block sums, so that a prefill
and token-by-token decoding give what the whole sequence gives. The cache
(``MoBACache``) holds ``max_len`` tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer
from lin_attn_jax.layers.softmax import head_layout, scan_steps
from lin_attn_jax.ops import (chunk_moba, init_moba_cache, moba_extend,
                              moba_step, parallel_moba)
from lin_attn_jax.ops.common import checks

_F32 = jnp.float32


class MoBA(Mixer):
  """Mixture of block attention with RoPE and grouped key/value heads.

  Args:
    d_model: ``D``. n_heads: ``H``; the head width is ``D / H`` (even, for
      RoPE).
    n_kv_heads: ``Hkv``, key/value heads, a divisor of ``H``; None for
      ``H``.
    block_size: MoBA's block of keys (256, as fla's ``moba_chunk_size``).
    top_k: blocks per query, its own included (4, as fla's ``moba_topk``;
      1 is causal attention, as in fla's op).
    chunk_size: queries per tile of the blockwise form (speed only).
    qkv_bias: the q, k, v projections have biases (False).
    qk_norm: RMSNorm of q and k per head (False).
    use_output_gate: gate the normalised output with ``sigmoid(x W_g1
      W_g2)`` (False).
    rope_base: base of the RoPE frequencies (10000).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               n_kv_heads: int | None = None, block_size: int = 256,
               top_k: int = 4, chunk_size: int = 64, qkv_bias: bool = False,
               qk_norm: bool = False, use_output_gate: bool = False,
               rope_base: float = 10000.0, dtype=_F32, param_dtype=_F32):
    self.n_kv_heads, self.head_dim = head_layout(d_model, n_heads, n_kv_heads)
    if self.head_dim % 2:
      raise ValueError(f"RoPE needs an even head width, got d_model / "
                       f"n_heads = {d_model} / {n_heads}")
    for name, value in (("block_size", block_size), ("top_k", top_k),
                        ("chunk_size", chunk_size)):
      checks.positive_int(name, value)
    self.n_heads, self.rope_base = n_heads, rope_base
    self.block_size, self.top_k, self.chunk_size = block_size, top_k, chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    hd = self.head_dim
    q_dim, kv_dim = n_heads * hd, self.n_kv_heads * hd
    self.q_proj = modules.dense(d_model, q_dim, use_bias=qkv_bias, **kw)
    self.k_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.v_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.o_proj = modules.dense(q_dim, d_model, ("heads", "embed"), **kw)
    norm = dict(rngs=rngs, axis_name=None, dtype=dtype,
                param_dtype=param_dtype)
    self.q_norm = modules.rms_norm(hd, eps=1e-5, **norm) if qk_norm else None
    self.k_norm = modules.rms_norm(hd, eps=1e-5, **norm) if qk_norm else None
    self.o_norm = modules.rms_norm(hd, eps=1e-6, **norm)
    self.g_down = (modules.dense(d_model, hd, ("embed", "rank"), **kw)
                   if use_output_gate else None)
    self.g_up = (modules.dense(hd, q_dim, ("rank", "heads"), **kw)
                 if use_output_gate else None)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    return init_moba_cache(batch_size, self.n_kv_heads, self.head_dim,
                           self.head_dim, max_length=max_len,
                           block_size=self.block_size, dtype=dtype)

  def recurrent_state_floats(self, seq_len):
    """The keys and values of the cache, ``2 x T x Hkv x head_dim``, and
    the key sums of the blocks, ``(T // block_size + 1) x Hkv x
    head_dim``."""
    per_token = self.n_kv_heads * self.head_dim
    return (2 * seq_len + seq_len // self.block_size + 1) * per_token

  def attend(self, q, k, v, ctx: Context):
    """``o [B, T, H, V]`` of a call without a cache in chunk or parallel
    mode."""
    options = dict(block_size=self.block_size, top_k=self.top_k,
                   segment_ids=ctx.segment_ids)
    if ctx.mode == "chunk":
      return chunk_moba(q, k, v, chunk_size=self.chunk_size, **options)
    return parallel_moba(q, k, v, **options)

  def attend_with_cache(self, q, k, v, ctx: Context):
    """``(o [B, T, H, V], new cache or None)``: the form of ``ctx`` (see
    the module docstring)."""
    if ctx.decoding:
      o, cache = moba_step(q[:, 0], k[:, 0], v[:, 0], ctx.cache,
                           top_k=self.top_k, reset=ctx.restart)
      return o[:, None], cache
    if ctx.mode == "recurrent":
      return self.token_by_token(q, k, v, ctx)
    if ctx.cache is not None:
      return moba_extend(q, k, v, ctx.cache, top_k=self.top_k,
                         segment_ids=ctx.segment_ids, reset=ctx.restart)
    return self.attend(q, k, v, ctx), None

  def token_by_token(self, q, k, v, ctx: Context):
    """``moba_step`` scanned over T from the cache of ``ctx`` (a fresh one
    without); returns ``(o, the cache or None)``."""
    b, t = q.shape[:2]
    cache = (self.init_mixer_cache(b, t, k.dtype) if ctx.cache is None
             else ctx.cache)
    o, cache = scan_steps(
        lambda cache, reset, **token: moba_step(
            **token, cache=cache, top_k=self.top_k, reset=reset),
        dict(q=q, k=k, v=v), cache, ctx.segment_ids, ctx.restart)
    return o, None if ctx.cache is None else cache

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h, hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
    q = self.q_proj(x).reshape(b, t, h, hd)                     # [B, T, H, K]
    k = self.k_proj(x).reshape(b, t, hkv, hd)                   # [B, T, Hkv, K]
    v = self.v_proj(x).reshape(b, t, hkv, hd)                   # [B, T, Hkv, V]
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q = modules.rotary(q, ctx.positions, self.rope_base)
    k = modules.rotary(k, ctx.positions, self.rope_base)
    o, cache = self.attend_with_cache(q, k, v, ctx)             # [B, T, H, V]
    o = self.o_norm(o)
    if self.g_up is not None:
      gate = jax.nn.sigmoid(self.g_up(self.g_down(x)).astype(_F32))
      o = (o.astype(_F32) * gate.reshape(b, t, h, hd)).astype(o.dtype)
    return self.o_proj(o.reshape(b, t, h * hd)), cache          # [B, T, D]
