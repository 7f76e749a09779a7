"""Nystromformer layer (Xiong et al. 2021, arXiv:2102.03902).

``q, k, v = x W_q + b_q, x W_k + b_k, x W_v + b_v`` with ``H`` heads;
``o = F A^+ B v`` through ``M`` landmarks (``ops.nystrom_attn``), plus the
reference's skip: a depthwise convolution of ``v`` along time, one kernel
per head shared by the head's channels (``Conv2d(H, H, (W, 1),
groups=H)``, width 33 in the reference's LRA configs); ``y = o W_o + b_o``.

Not causal: no cache, no recurrent mode. A row holds one document (see
``ops.nystrom_attn``).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer
from lin_attn_jax.layers.encoder_modules import checks_width, conv_weight
from lin_attn_jax.layers.softmax import head_layout
from lin_attn_jax.ops import nystrom_attn
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.pooling import same_depthwise_conv
from lin_attn_jax.ops.nystrom_attn.pinv import PINV_INITS


class Nystromformer(Mixer):
  """Nystrom-approximated softmax attention (non-causal).

  Args:
    d_model: ``D``. n_heads: ``H``.
    num_landmarks: ``M`` (64, the paper's; ``M >= T`` is exact attention).
    pinv_iterations: steps of the pseudo-inverse iteration (6).
    pinv_init: ``"per_matrix"`` (the paper's ``Z_0``) or ``"original"``
      (the reference code's batch-wide one), see ``ops.iterative_pinv``.
    conv_kernel_size: width of the skip convolution of ``v`` (odd), None to
      leave it out.
  """

  causal = False

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               num_landmarks: int = 64, pinv_iterations: int = 6,
               pinv_init: str = "per_matrix",
               conv_kernel_size: int | None = 33, dtype=jnp.float32,
               param_dtype=jnp.float32):
    _, self.head_dim = head_layout(d_model, n_heads, None)
    checks.positive_int("num_landmarks", num_landmarks)
    checks.positive_int("pinv_iterations", pinv_iterations)
    if pinv_init not in PINV_INITS:
      raise ValueError(f"pinv_init must be one of {PINV_INITS}, got "
                       f"{pinv_init!r}")
    if conv_kernel_size is not None:
      checks_width(conv_kernel_size)
    self.n_heads, self.dtype = n_heads, dtype
    self.num_landmarks, self.pinv_iterations = num_landmarks, pinv_iterations
    self.pinv_init = pinv_init
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=True)
    self.q_proj = modules.dense(d_model, d_model, **kw)
    self.k_proj = modules.dense(d_model, d_model, **kw)
    self.v_proj = modules.dense(d_model, d_model, **kw)
    self.o_proj = modules.dense(d_model, d_model, ("heads", "embed"), **kw)
    self.conv_weight = (None if conv_kernel_size is None else
                        conv_weight(rngs, n_heads, conv_kernel_size,
                                    param_dtype))

  def init_mixer_cache(self, batch_size, max_len, dtype):
    raise ValueError("Nystromformer is not causal: it has no cache")

  def mix(self, x, ctx: Context):
    b, t, d = x.shape
    h, hd = self.n_heads, self.head_dim
    q = self.q_proj(x).reshape(b, t, h, hd)                     # [B, T, H, K]
    k = self.k_proj(x).reshape(b, t, h, hd)                     # [B, T, H, K]
    v = self.v_proj(x).reshape(b, t, h, hd)                     # [B, T, H, V]
    o = nystrom_attn(q, k, v, num_landmarks=self.num_landmarks,
                     pinv_iterations=self.pinv_iterations,
                     pinv_init=self.pinv_init,
                     segment_ids=ctx.segment_ids)               # [B, T, H, V]
    o = o.reshape(b, t, d)
    if self.conv_weight is not None:
      weight = jnp.repeat(self.conv_weight[...], hd, axis=0)    # [D, W]
      o = o + same_depthwise_conv(v.reshape(b, t, d), weight,
                                  segment_ids=ctx.segment_ids).astype(o.dtype)
    return self.o_proj(o.astype(self.dtype)), None
