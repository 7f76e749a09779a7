"""PaTH attention (Yang et al., 2025, arXiv:2505.16381), as
flash-linear-attention's ``PaTHAttention`` layer.

``q = x W_q`` with ``H`` heads, ``k = x W_k`` and ``v = x W_v`` with
``Hkv`` heads (head width ``D / H``), no RoPE: position enters through the
Householder transformations. Per key head and token, a direction ``w =
l2_normalize(silu(short_conv(x W_w^down W_w^up)))`` (a rank-32 projection,
or a full one with ``use_low_rank_w=False``; the short convolution of 3
taps with SiLU is optional) and a strength ``beta = 2 sigmoid(x W_b + b)``
in (0, 2) (negative eigenvalues allowed); optionally a forget gate per
query head, ``g = log_sigmoid(x W_g + b_g)``, and RMSNorms of q and k per
head. Then

    H_s = I - beta_s w_s w_s^T
    z_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j
    y_i = W_o sum_j softmax_j((z_ij + c_i - c_j) / sqrt(D / H)) v_j

with ``c = cumsum(g)`` (the forget gate's bias, scaled with the logits as
in fla). The forms of every mode:

- no cache (``Mixer.apply_forms``): ``chunk_path_attn`` in ``"chunk"``
  mode (blockwise, never ``[T, T]``), ``parallel_path_attn`` (the
  definition) in ``"parallel"``, ``path_attn_step`` scanned over an empty
  cache in ``"recurrent"``;
- with a cache: one step for ``T = 1``; otherwise ``path_attn_extend``
  (prefill), or the steps scanned over the cache in ``"recurrent"``.

The cache is ``{"conv": the last conv_size - 1 inputs of the w
convolution, "state": a PaTHCache}`` (only ``"state"`` without the
convolution): the keys as the next token sees them (moved across every
later reflection), the values and, with the gate, each entry's gate sum.
It holds ``max_len`` entries; under ``jit`` tokens past it are not stored
(outside ``jit`` the op raises).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms
from lin_attn_jax.layers.softmax import head_layout
from lin_attn_jax.ops import (chunk_path_attn, init_path_cache,
                              parallel_path_attn, path_attn_extend,
                              path_attn_step)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.delta_rule.inputs import l2_normalize

_F32 = jnp.float32


def _steps(q, k, v, w, beta, g, cache, resets):
  """``path_attn_step`` scanned over T from ``cache``, ``resets [B, T]``
  True where a token starts a document. Returns ``(o [B, T, H, V],
  cache)``."""

  def one_token(cache, xs):
    token, reset_t = xs
    o, cache = path_attn_step(**token, cache=cache, reset=reset_t)
    return cache, o

  tokens = {n: None if x is None else jnp.swapaxes(x, 0, 1)
            for n, x in dict(q=q, k=k, v=v, w=w, beta=beta, g=g).items()}
  cache, o = jax.lax.scan(one_token, cache, (tokens, resets.T))
  return jnp.swapaxes(o, 0, 1), cache                           # [B,T,H,V]


def _empty_cache(k, v, g, heads):
  """A cache for the whole of ``k [B, T, Hkv, K]``."""
  b, t, hkv, dk = k.shape
  return init_path_cache(b, hkv, dk, v.shape[-1], max_length=t,
                         gate_heads=None if g is None else heads,
                         dtype=k.dtype)


def _without_state(fn):
  """A sequence op returning ``o`` as a form of ``OpForms``, returning
  ``(o, None)``: without a cache the layer has no state to carry (with
  one, ``PaTHAttention.attend_with_cache`` runs the cache's ops)."""
  def form(*, initial_state=None, output_final_state=False, **inputs):
    del initial_state, output_final_state
    return fn(**inputs), None
  return form


def _recurrent(q, k, v, w, beta, g=None, *, segment_ids=None, **unused):
  """The decoding step over every token from an empty cache."""
  del unused
  resets = reset_flags(segment_ids, q.shape[0], q.shape[1])
  return _steps(q, k, v, w, beta, g, _empty_cache(k, v, g, q.shape[2]),
                resets)[0], None


def _step(q, k, v, w, beta, g=None, *, state, reset=None):
  return path_attn_step(q, k, v, w, beta, state, g=g, reset=reset)


# The forms of a call without a cache (``Mixer.apply_forms``).
PATH_FORMS = OpForms(_without_state(chunk_path_attn),
                     _without_state(parallel_path_attn), _recurrent, _step)


class PaTHAttention(Mixer):
  """PaTH attention: softmax attention whose logits cross accumulated
  Householder transformations (see the module docstring).

  Args:
    d_model: ``D``. n_heads: ``H``; the head width is ``D / H``.
    n_kv_heads: ``Hkv``, key/value heads (and heads of ``w`` and
      ``beta``), a divisor of ``H``; None for ``H``.
    use_forget_gate: a forget gate per query head, ``log_sigmoid(x W_g +
      b_g)`` (False, as fla).
    use_qk_norm: RMSNorm of q and k over each head, one scale of ``D / H``
      shared by the heads (False, as fla).
    use_low_rank_w: ``w`` from a rank-``w_rank`` projection (True, as fla;
      fla advises a full projection, False, with grouped heads, where it
      costs fewer parameters).
    w_rank: the rank of that projection (32, fla's).
    use_w_shortconv: a causal depthwise convolution with SiLU on ``w``
      before it is normalised (True, as fla).
    conv_size: taps of that convolution (3, fla's). conv_bias: its bias
      (False).
    norm_eps: epsilon of the q/k RMSNorms (1e-5, fla's ``RMSNorm``).
    chunk_size: tokens per chunk of the blockwise form (speed and memory
      only); None: 16 on CPU, 64 on TPU/GPU (``base.resolved_chunk_size``).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               n_kv_heads: int | None = None, use_forget_gate: bool = False,
               use_qk_norm: bool = False, use_low_rank_w: bool = True,
               w_rank: int = 32, use_w_shortconv: bool = True,
               conv_size: int = 3, conv_bias: bool = False,
               norm_eps: float = 1e-5, chunk_size: int | None = None,
               dtype=_F32, param_dtype=_F32):
    self.n_kv_heads, self.head_dim = head_layout(d_model, n_heads, n_kv_heads)
    checks.positive_int("w_rank", w_rank)
    checks.positive_int("conv_size", conv_size)
    checks.positive_int("chunk_size", chunk_size, allow_none=True)
    self.n_heads, self.chunk_size = n_heads, chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    q_dim, kv_dim = n_heads * self.head_dim, self.n_kv_heads * self.head_dim
    self.q_proj = modules.dense(d_model, q_dim, **kw)
    self.k_proj = modules.dense(d_model, kv_dim, **kw)
    self.v_proj = modules.dense(d_model, kv_dim, **kw)
    if use_low_rank_w:
      self.w_down = modules.dense(d_model, w_rank, ("embed", "rank"), **kw)
      self.w_up = modules.dense(w_rank, kv_dim, ("rank", "heads"), **kw)
    else:
      self.w_proj = modules.dense(d_model, kv_dim, **kw)
    self.use_low_rank_w = use_low_rank_w
    self.w_conv = (modules.ShortConv(kv_dim, conv_size, rngs=rngs,
                                     activation="silu", use_bias=conv_bias,
                                     param_dtype=param_dtype)
                   if use_w_shortconv else None)
    self.b_proj = modules.dense(d_model, self.n_kv_heads, use_bias=True, **kw)
    self.g_proj = (modules.dense(d_model, n_heads, use_bias=True, **kw)
                   if use_forget_gate else None)
    norm = dict(rngs=rngs, axis_name="head_dim", eps=norm_eps,
                param_dtype=param_dtype)
    self.q_norm = (modules.rms_norm(self.head_dim, **norm) if use_qk_norm
                   else None)
    self.k_norm = (modules.rms_norm(self.head_dim, **norm) if use_qk_norm
                   else None)
    self.o_proj = modules.dense(q_dim, d_model, ("heads", "embed"), **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    state = init_path_cache(
        batch_size, self.n_kv_heads, self.head_dim, self.head_dim,
        max_length=max_len,
        gate_heads=None if self.g_proj is None else self.n_heads, dtype=dtype)
    if self.w_conv is None:
      return {"state": state}
    return {"conv": self.w_conv.init_state(batch_size), "state": state}

  def recurrent_state_floats(self, seq_len):
    """The keys and values of the cache, ``2 x T x Hkv x head_dim`` (plus
    ``T x H`` gate sums with the forget gate)."""
    size = 2 * seq_len * self.n_kv_heads * self.head_dim
    if self.g_proj is not None:
      size += seq_len * self.n_heads
    return size

  def conv_state_floats(self):
    if self.w_conv is None:
      return 0
    return (self.w_conv.width - 1) * self.w_conv.channels

  def directions(self, x, ctx: Context, window):
    """``(w [B, T, Hkv, K] float32 unit-norm, the convolution's new window
    or None)``."""
    b, t, _ = x.shape
    w = (self.w_up(self.w_down(x)) if self.use_low_rank_w
         else self.w_proj(x))                                   # [B, T, Hkv*K]
    if self.w_conv is not None:
      w, window = self.w_conv(w, ctx, window)
    w = w.reshape(b, t, self.n_kv_heads, self.head_dim)        # [B,T,Hkv,K]
    return l2_normalize(w), window

  def attend_with_cache(self, ctx: Context, tokens: dict, cache):
    """The op of ``ctx``'s mode on the cache (see the module docstring):
    ``(o [B, T, H, V], new cache)``."""
    if ctx.decoding:
      o, cache = path_attn_step(**{n: None if x is None else x[:, 0]
                                   for n, x in tokens.items()},
                                cache=cache, reset=ctx.restart)
      return o[:, None], cache
    if ctx.mode == "recurrent":
      b, t = tokens["q"].shape[:2]
      resets = reset_flags(ctx.segment_ids, b, t)               # [B, T]
      if ctx.restart is not None:
        resets = resets.at[:, 0].set(ctx.restart)
      return _steps(**tokens, cache=cache, resets=resets)
    return path_attn_extend(**tokens, cache=cache,
                            segment_ids=ctx.segment_ids, reset=ctx.restart)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    hd = self.head_dim
    window = state = None
    if ctx.cache is not None:
      window, state = ctx.cache.get("conv"), ctx.cache["state"]
    q = self.q_proj(x).reshape(b, t, self.n_heads, hd)          # [B, T, H, K]
    k = self.k_proj(x).reshape(b, t, self.n_kv_heads, hd)       # [B, T, Hkv, K]
    v = self.v_proj(x).reshape(b, t, self.n_kv_heads, hd)       # [B, T, Hkv, V]
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    w, window = self.directions(x, ctx, window)                 # [B, T, Hkv, K]
    beta = 2.0 * jax.nn.sigmoid(self.b_proj(x).astype(_F32))    # [B, T, Hkv]
    g = (None if self.g_proj is None
         else jax.nn.log_sigmoid(self.g_proj(x).astype(_F32)))  # [B, T, H]
    # z_ij = q_i^T H_i ... H_{j+1} k_j
    # o_i = sum_j softmax_j((z_ij + c_i - c_j) / sqrt(K)) v_j
    tokens = dict(q=q, k=k, v=v, w=w, beta=beta, g=g)
    if state is None:
      o, _ = self.apply_forms(ctx, PATH_FORMS, tokens)          # [B, T, H, V]
    else:
      o, state = self.attend_with_cache(ctx, tokens, state)
    y = self.o_proj(o.reshape(b, t, self.n_heads * hd))         # [B, T, D]
    if ctx.cache is None:
      return y, None
    if self.w_conv is None:
      return y, {"state": state}
    return y, {"conv": window, "state": state}
