"""The Forgetting Transformer's attention layer (Lin et al., 2025,
arXiv:2503.02130), as flash-linear-attention's ``ForgettingAttention``.

``q = x W_q`` with ``H`` heads, ``k = x W_k`` and ``v = x W_v`` with ``Hkv``
heads (grouped-query attention), head width ``D / H``, no position encoding
(the forget gate orders the tokens); the forget gate of each query head,
``g = log_sigmoid(x W_f + b_f)`` (float32); optionally a per-head RMSNorm of
q and k (``qk_norm``, fla's ``GroupNorm`` with one group per head, eps
1e-5); ``o_i = sum_j softmax_j(q_i . k_j / sqrt(D / H) + sum_{l = j + 1 ..
i} g_l) v_j``; optionally an output gate ``o * sigmoid(x W_g)``; ``y = o
W_o``. The FoX paper's "Pro" block is the output gate, the q/k norms and a
token shift of k and v; ``use_short_conv`` (off, as in fla, whose layer has
none) gives q, k and v the short convolutions the other mixers take
instead.

The forms of every mode:

- no cache, ``"chunk"``: the blockwise online-softmax op (never ``[T, T]``),
  in XLA or on the Pallas kernels as ``impl`` says;
- no cache, ``"parallel"``: the dense reference op;
- ``"recurrent"``: a ``lax.scan`` of one-token decoding steps over a fresh
  cache (or over the given one);
- with a cache, ``T > 1`` in ``"chunk"`` or ``"parallel"``: the new tokens
  are appended with ``forgetting_attn_extend``; ``T = 1``: one step.

The cache is a ``ForgettingCache``: the keys and values of ``max_len``
entries (``window_size`` for a window: a ring buffer) in the dtype given to
``init_cache``, and each entry's gate decay to the latest token per query
head, float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, checked_impl
from lin_attn_jax.layers.softmax import head_layout, scan_steps
from lin_attn_jax.ops import (chunk_forgetting_attn, forgetting_attn_extend,
                              forgetting_attn_step, init_forgetting_cache,
                              parallel_forgetting_attn)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.softmax_attn.inputs import check_window


def token_by_token(ctx: Context, q, k, v, g, cache):
  """``forgetting_attn_step`` scanned over T; a token resets where its
  document starts. Returns ``(o [B, T, H, V], cache)``."""
  return scan_steps(
      lambda cache, reset, **token: forgetting_attn_step(
          **token, cache=cache, reset=reset),
      dict(q=q, k=k, v=v, g=g), cache, ctx.segment_ids, ctx.restart)


class ForgettingAttention(Mixer):
  """Forgetting attention: softmax attention with a forget gate per query
  head (see the module docstring).

  Args:
    d_model: ``D``. n_heads: ``H``; the head width is ``D / H``.
    n_kv_heads: ``Hkv``, key/value heads, a divisor of ``H``; None for
      ``H`` (fla's ``num_kv_heads``).
    qkv_bias: q, k and v projections with a bias (False, as fla).
    qk_norm: per-head RMSNorm of q and k (False, as fla).
    window_size: ``w``: each token sees itself and the ``w - 1`` before it
      (the cache is then a ring buffer of ``w``); None for none (fla's
      default).
    use_output_gate: ``o * sigmoid(x W_g)`` before the output projection
      (False, as fla).
    use_short_conv: q, k and v each through a depthwise causal convolution
      with SiLU right after its projection (``modules.QKVShortConv``;
      False). conv_size: its taps (4). conv_bias: its bias (False).
    norm_eps: epsilon of the q/k norms (1e-5, fla's ``GroupNorm``).
    block_size: query and key positions per block of the chunk form's XLA
      implementation (speed only).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the chunk form's
      implementation (``chunk_forgetting_attn``,
      ``lin_attn_jax.ops.common.dispatch``).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               n_kv_heads: int | None = None, qkv_bias: bool = False,
               qk_norm: bool = False, window_size: int | None = None,
               use_output_gate: bool = False, use_short_conv: bool = False,
               conv_size: int = 4, conv_bias: bool = False,
               norm_eps: float = 1e-5, block_size: int = 128,
               impl: str = "auto", dtype=jnp.float32,
               param_dtype=jnp.float32):
    self.n_kv_heads, self.head_dim = head_layout(d_model, n_heads, n_kv_heads)
    check_window(window_size)
    checks.positive_int("block_size", block_size)
    self.n_heads, self.window_size = n_heads, window_size
    self.block_size = block_size
    self.impl = checked_impl(impl)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    q_dim, kv_dim = n_heads * self.head_dim, self.n_kv_heads * self.head_dim
    self.q_proj = modules.dense(d_model, q_dim, use_bias=qkv_bias, **kw)
    self.k_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.v_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.f_proj = modules.dense(d_model, n_heads, use_bias=True, **kw)
    self.short_conv = modules.qkv_short_conv(
        use_short_conv, (q_dim, kv_dim, kv_dim), conv_size, conv_bias,
        rngs=rngs, param_dtype=param_dtype)
    norm = dict(rngs=rngs, eps=norm_eps, param_dtype=param_dtype)
    self.q_norm = (modules.HeadNorm(n_heads, self.head_dim, **norm)
                   if qk_norm else None)
    self.k_norm = (modules.HeadNorm(self.n_kv_heads, self.head_dim, **norm)
                   if qk_norm else None)
    self.g_proj = (modules.dense(d_model, q_dim, **kw) if use_output_gate
                   else None)
    self.o_proj = modules.dense(q_dim, d_model, ("heads", "embed"), **kw)

  def attention_cache(self, batch_size, max_len, dtype):
    """An empty ``ForgettingCache`` (the cache without the convolutions'
    windows)."""
    return init_forgetting_cache(
        batch_size, self.n_heads, self.n_kv_heads, self.head_dim,
        self.head_dim, max_length=max_len, window_size=self.window_size,
        dtype=dtype)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    return self.with_conv_cache(batch_size,
                                self.attention_cache(batch_size, max_len,
                                                     dtype))

  def recurrent_state_floats(self, seq_len):
    """The cache after ``T`` tokens: keys and values, ``2 x T x Hkv x
    head_dim``, and a gate decay per entry and query head, ``T x H``
    (``min(w, T)`` entries under a window)."""
    entries = (seq_len if self.window_size is None
               else min(seq_len, self.window_size))
    return entries * (2 * self.n_kv_heads * self.head_dim + self.n_heads)

  def attend(self, q, k, v, ctx: Context, g):
    """``o [B, T, H, V]`` of a call without a cache in chunk or parallel
    mode."""
    options = dict(window_size=self.window_size, segment_ids=ctx.segment_ids)
    if ctx.mode == "chunk":
      return chunk_forgetting_attn(q, k, v, g, block_size=self.block_size,
                                   impl=self.impl, **options)
    return parallel_forgetting_attn(q, k, v, g, **options)

  def attend_with_cache(self, ctx: Context, q, k, v, g, cache):
    """The forms with a cache, and the recurrent mode (the module
    docstring's list). Returns ``(o [B, T, H, V], new cache or None)``."""
    if ctx.decoding:
      o, cache = forgetting_attn_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0],
                                      cache, reset=ctx.restart)
      return o[:, None], cache
    if ctx.mode == "recurrent":
      b, t = q.shape[:2]
      o, scanned = token_by_token(
          ctx, q, k, v, g,
          self.attention_cache(b, t, k.dtype) if cache is None else cache)
      return o, None if cache is None else scanned
    return forgetting_attn_extend(q, k, v, g, cache,
                                  segment_ids=ctx.segment_ids,
                                  reset=ctx.restart)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h, hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
    (q, k, v), conv, cache = self.short_convolved(
        self.q_proj(x), self.k_proj(x), self.v_proj(x), ctx)
    q = q.reshape(b, t, h, hd)                                  # [B, T, H, K]
    k = k.reshape(b, t, hkv, hd)                                # [B, T, Hkv, K]
    v = v.reshape(b, t, hkv, hd)                                # [B, T, Hkv, V]
    if self.q_norm is not None:
      q = self.q_norm(q).reshape(b, t, h, hd)
      k = self.k_norm(k).reshape(b, t, hkv, hd)
    g = jax.nn.log_sigmoid(self.f_proj(x).astype(jnp.float32))  # [B, T, H]
    # o_i = sum_j softmax_j(q_i k_j / sqrt(K) + sum_{l=j+1..i} g_l) v_j
    if cache is None and ctx.mode != "recurrent":
      o = self.attend(q, k, v, ctx, g)                          # [B, T, H, V]
    else:
      o, cache = self.attend_with_cache(ctx, q, k, v, g, cache)
    o = o.reshape(b, t, h * hd)
    if self.g_proj is not None:
      gate = jax.nn.sigmoid(self.g_proj(x).astype(jnp.float32))
      o = (gate * o.astype(jnp.float32)).astype(o.dtype)
    return self.o_proj(o), self.joined_cache(conv, cache)       # [B, T, D]
