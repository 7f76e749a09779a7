"""Linear attention layer (Katharopoulos et al. 2020, "Transformers are RNNs",
arXiv:2006.16236).

``q, k, v = x W_q, x W_k, x W_v`` split over ``H`` heads of ``D / H``; with a
feature map ``phi`` (``elu(x) + 1`` in the paper)

    o_t = phi(q_t)^T S_t / (phi(q_t) . z_t),
    S_t = sum_{j<=t} phi(k_j) v_j^T,  z_t = sum_{j<=t} phi(k_j),

and ``y = o W_o``. With ``use_short_conv`` the three projections first go
through short convolutions with SiLU (before ``phi``), as the Based paper
and Zoology pair linear attention with a short convolution. The normalizer ``z`` rides in the state as one extra value
column (``normalize=True`` of the ``linear_attn`` ops).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax import feature_maps
from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms, checked_impl
from lin_attn_jax.ops import (chunk_linear_attn, linear_attn_step,
                              parallel_linear_attn, recurrent_linear_attn)

LINEAR_ATTN_FORMS = OpForms(chunk_linear_attn, parallel_linear_attn,
                            recurrent_linear_attn, linear_attn_step)

# PyTorch's nn.Linear default, uniform in +-1/sqrt(fan_in), which the paper's
# code (fast-transformers) keeps.
TORCH_LINEAR_INIT = nnx.initializers.variance_scaling(1 / 3, "fan_in",
                                                      "uniform")


def head_dim(width: int, n_heads: int, name: str) -> int:
  """``width // n_heads``, or a ``ValueError`` when it does not divide."""
  if n_heads < 1 or width < 1 or width % n_heads:
    raise ValueError(f"{name} = {width} must divide into n_heads = {n_heads}")
  return width // n_heads


class LinearAttention(Mixer):
  """Kernelized linear attention with a fixed feature map.

  Projections are initialised uniformly in ``+-1/sqrt(fan_in)`` (PyTorch's
  default, kept by the paper's code). The cache is the state
  ``[B, H, F, V (+ 1)]`` float32, ``F`` the feature width (with the
  convolutions' windows beside it under ``use_short_conv``).

  The short convolutions sit where flash-linear-attention puts them in its
  GLA and retention layers, one per projection (q, k and v) right after it,
  with SiLU; its ``LinearAttention`` has none. Zoology's MQAR protocol and
  the Based models instead put a gated convolution (``BaseConv``) in front
  of the mixer as a layer of its own; the per-projection placement is kept
  here so that every mixer with the option convolves the same things.

  Args:
    d_model: ``D``. n_heads: ``H``; q, k and v heads have ``D / H`` channels.
    feature_map: a name in ``feature_maps.FEATURE_MAPS`` (``"elu_plus_one"``,
      the paper's; ``"taylor"`` widens ``F`` to ``1 + K + K^2``).
    normalize: divide by ``phi(q_t) . sum_j phi(k_j)`` (the paper does); needs
      a map whose kernel is positive, so ``"identity"`` is refused.
    use_short_conv: pass q, k and v each through a depthwise causal
      convolution with SiLU right after its projection
      (``modules.QKVShortConv``; False).
    conv_size: taps of the short convolutions (4).
    conv_bias: the short convolutions have a bias (False).
    chunk_size: chunk length of the chunk form (speed only).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the chunk form's
      implementation (``lin_attn_jax.ops.common.dispatch``).
    causal: False for the non-causal layer: every token reads its
      whole document in both directions (``Mixer.set_causal``).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               feature_map: str = "elu_plus_one", normalize: bool = True,
               use_short_conv: bool = False, conv_size: int = 4,
               conv_bias: bool = False, chunk_size: int = 64,
               impl: str = "auto",
               causal: bool = True, dtype=jnp.float32,
               param_dtype=jnp.float32):
    self.set_causal(causal)
    if feature_map not in feature_maps.FEATURE_MAPS:
      raise ValueError(f"feature_map must be one of "
                       f"{sorted(feature_maps.FEATURE_MAPS)}, got "
                       f"{feature_map!r}")
    if normalize and feature_map == "identity":
      raise ValueError("normalize=True divides by phi(q) . sum phi(k), which "
                       "needs positive features; feature_map='identity' is "
                       "signed (use normalize=False)")
    self.n_heads, self.chunk_size = n_heads, chunk_size
    self.impl = checked_impl(impl)
    self.normalize = normalize
    self.head_dim = head_dim(d_model, n_heads, "d_model")
    self.phi = feature_maps.FEATURE_MAPS[feature_map]
    self.feature_dim = jax.eval_shape(
        self.phi, jax.ShapeDtypeStruct((self.head_dim,), jnp.float32)).shape[-1]
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype,
              kernel_init=TORCH_LINEAR_INIT)
    self.q_proj = modules.dense(d_model, d_model, **kw)
    self.k_proj = modules.dense(d_model, d_model, **kw)
    self.v_proj = modules.dense(d_model, d_model, **kw)
    self.short_conv = modules.qkv_short_conv(
        use_short_conv, (d_model,) * 3, conv_size, conv_bias, rngs=rngs,
        param_dtype=param_dtype)
    self.o_proj = modules.dense(d_model, d_model, ("heads", "embed"), **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return self.with_conv_cache(batch_size, jnp.zeros(
        (batch_size, self.n_heads, self.feature_dim,
         self.head_dim + int(self.normalize)), jnp.float32))

  def recurrent_state_floats(self, seq_len):
    """``H x F x (D / H + 1)`` (the normalizer column when normalizing)."""
    del seq_len
    return self.n_heads * self.feature_dim * (self.head_dim
                                              + int(self.normalize))

  def attend_features(self, q, k, v, ctx: Context, state=None):
    """Linear attention of mapped features ``q, k: [B, T, H, F]`` (no
    further scale) and ``v: [B, T, H, V]`` from the cached ``state``
    ``[B, H, F, V (+ 1)]`` (None without a cache):

        o_t = phi(q_t)^T S_t (/ phi(q_t) . z_t),  S_t = S_{t-1} + phi(k_t) v_t^T

    Returns ``(o [B, T, H, V], new state or None)``.
    """
    return self.apply_forms(ctx, LINEAR_ATTN_FORMS, dict(q=q, k=k, v=v),
                            state, scale=1.0, normalize=self.normalize)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    shape = (b, t, self.n_heads, self.head_dim)
    (q, k, v), conv, cache = self.short_convolved(
        self.q_proj(x), self.k_proj(x), self.v_proj(x), ctx)
    q = self.phi(q.reshape(shape))                              # [B, T, H, F]
    k = self.phi(k.reshape(shape))                              # [B, T, H, F]
    v = v.reshape(shape)                                        # [B, T, H, V]
    o, state = self.attend_features(q, k, v, ctx, cache)       # [B, T, H, V]
    return self.o_proj(o.reshape(b, t, -1)), self.joined_cache(conv, state)
