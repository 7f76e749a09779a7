"""Based layer (Arora et al. 2024, "Simple linear attention language models
balance the recall-throughput tradeoff", arXiv:2402.18668).

Two branches over the same tokens, summed before the output projection:

- linear attention with the second-order Taylor map on a small feature width
  ``F`` (16): ``q, k = x W_q, x W_k`` (``[B, T, H, F]``),
  ``phi(q) . phi(k) = 1 + q.k / sqrt(F) + (q.k)^2 / (2 F)``, normalized;
- softmax attention in a sliding window of ``w`` tokens (64):
  ``q', k' = rotary(x W_q'), rotary(x W_k')`` (``[B, T, H, D / H]``), each
  query seeing itself and the ``w - 1`` tokens before it.

Both read the same values ``v = x W_v`` (``[B, T, H, D / H]``); the layer
returns ``y = (o_linear + o_window) W_o``. The paper stacks the two as
separate layers (with short convolutions in others); here one mixer holds
both. With ``use_short_conv``, the linear branch's ``q``, ``k`` and the
shared ``v`` first go through short convolutions with SiLU.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import (Context, Mixer, OpForms, checked_impl,
                                      zero_state)
from lin_attn_jax.layers.linear_attn import head_dim
from lin_attn_jax.layers.softmax import attend_with_cache, window_attend
from lin_attn_jax.ops import (based_step, chunk_based, init_kv_cache,
                              parallel_based, recurrent_based)
from lin_attn_jax.ops.common import checks

BASED_FORMS = OpForms(chunk_based, parallel_based, recurrent_based, based_step)


class Based(Mixer):
  """Taylor linear attention plus sliding-window softmax attention.

  Projections are normal with standard deviation 0.02 (the GPT-2 style
  initialisation of the paper's code, less its depth-dependent shrinking of
  output projections, which belongs to the model). The cache holds what
  decoding needs: ``"state"``, the Taylor linear-attention state
  ``[B, H, 1 + F + F^2, D / H + 1]`` float32 (the last column is the
  normalizer), and ``"window"``, a ring-buffer ``KVCache`` of the last ``w``
  rotated keys and values; with ``use_short_conv``, the convolutions'
  windows beside them (``Mixer.with_conv_cache``).

  The short convolutions are placed as flash-linear-attention places them
  in its GLA and retention layers (its ``BasedLinearAttention`` has none):
  one per projection, right after it, with SiLU. The Based models and
  Zoology's MQAR runs put a gated convolution (``BaseConv``) in front of
  the mixer as a layer of its own instead; the per-projection placement
  keeps the option the same across the library's mixers.

  Args:
    d_model: ``D``. n_heads: ``H``.
    feature_dim: ``F``, the width of q and k of the linear branch (16).
    window_size: ``w``, tokens each query of the window branch sees (64).
    use_short_conv: pass the linear branch's q and k and the shared v each
      through a depthwise causal convolution with SiLU right after its
      projection (``modules.QKVShortConv``; False).
    conv_size: taps of the short convolutions (4).
    conv_bias: the short convolutions have a bias (False).
    chunk_size: chunk length of the linear chunk form and block length of
      the blockwise window attention (speed only).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the linear chunk form's
      implementation (``lin_attn_jax.ops.common.dispatch``).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               feature_dim: int = 16, window_size: int = 64,
               use_short_conv: bool = False, conv_size: int = 4,
               conv_bias: bool = False, chunk_size: int = 64, impl: str = "auto", dtype=jnp.float32,
               param_dtype=jnp.float32):
    for name, value in (("feature_dim", feature_dim),
                        ("window_size", window_size)):
      checks.positive_int(name, value)
    self.n_heads, self.chunk_size = n_heads, chunk_size
    self.impl = checked_impl(impl)
    self.feature_dim, self.window_size = feature_dim, window_size
    self.head_dim = head_dim(d_model, n_heads, "d_model")
    if self.head_dim % 2:
      raise ValueError(f"the window branch applies rotary embeddings, which "
                       f"need an even head width; d_model / n_heads = "
                       f"{self.head_dim}")
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype,
              kernel_init=nnx.initializers.normal(0.02))
    self.q_proj = modules.dense(d_model, n_heads * feature_dim, **kw)
    self.k_proj = modules.dense(d_model, n_heads * feature_dim, **kw)
    self.v_proj = modules.dense(d_model, d_model, **kw)
    self.short_conv = modules.qkv_short_conv(
        use_short_conv, (n_heads * feature_dim,) * 2 + (d_model,), conv_size,
        conv_bias, rngs=rngs, param_dtype=param_dtype)
    self.window_q_proj = modules.dense(d_model, d_model, **kw)
    self.window_k_proj = modules.dense(d_model, d_model, **kw)
    self.o_proj = modules.dense(d_model, d_model, ("heads", "embed"), **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len
    f = self.feature_dim
    return self.with_conv_cache(batch_size, {
        "state": zero_state(batch_size, self.n_heads, 1 + f + f * f,
                            self.head_dim + 1),
        "window": init_kv_cache(batch_size, self.n_heads, self.head_dim,
                                self.head_dim, window_size=self.window_size,
                                dtype=dtype),
    })

  def recurrent_state_floats(self, seq_len):
    """The Taylor state ``H x (1 + F + F^2) x (D / H + 1)`` and the window's
    keys and values, ``2 x min(w, T) x D``."""
    f, h, dh = self.feature_dim, self.n_heads, self.head_dim
    window = min(seq_len, self.window_size)
    return h * (1 + f + f * f) * (dh + 1) + 2 * window * h * dh

  def attend(self, q, k, v, ctx: Context):
    """The window branch of a call without a cache in chunk or parallel
    mode: softmax attention over the last ``window_size`` tokens, ``o [B, T,
    H, V]``."""
    return window_attend(q, k, v, ctx, window_size=self.window_size,
                         block_size=self.chunk_size)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h, dh, f = self.n_heads, self.head_dim, self.feature_dim
    (q, k, v), conv, cache = self.short_convolved(
        self.q_proj(x), self.k_proj(x), self.v_proj(x), ctx)
    cache = {"state": None, "window": None} if cache is None else cache
    q = q.reshape(b, t, h, f)                                   # [B, T, H, F]
    k = k.reshape(b, t, h, f)                                   # [B, T, H, F]
    v = v.reshape(b, t, h, dh)                                  # [B, T, H, V]
    # o_t = phi(q_t)^T S_t / (phi(q_t) . z_t), phi the Taylor map
    o_linear, state = self.apply_forms(ctx, BASED_FORMS, dict(q=q, k=k, v=v),
                                       cache["state"])          # [B, T, H, V]
    wq = modules.rotary(self.window_q_proj(x).reshape(b, t, h, dh),
                        ctx.positions)                          # [B, T, H, K]
    wk = modules.rotary(self.window_k_proj(x).reshape(b, t, h, dh),
                        ctx.positions)                          # [B, T, H, K]
    # o_t = softmax(q'_t k'^T / sqrt(K)) v over the last w tokens
    o_window, window = attend_with_cache(
        ctx, wq, wk, v, cache["window"],
        attend=self.attend,
        empty_cache=lambda: init_kv_cache(
            b, h, dh, dh, window_size=self.window_size,
            dtype=wk.dtype))                                    # [B, T, H, V]
    o = o_linear.astype(jnp.float32) + o_window.astype(jnp.float32)
    y = self.o_proj(o.astype(x.dtype).reshape(b, t, -1))
    new_cache = None if ctx.cache is None else {"state": state,
                                                "window": window}
    return y, self.joined_cache(conv, new_cache)
