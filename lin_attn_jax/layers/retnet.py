"""RetNet multi-scale retention layer (Sun et al. 2023, "Retentive Network: A
Successor to Transformer for Large Language Models", arXiv:2307.08621).

``q, k = rotary(x W_q), rotary(x W_k)`` (``[B, T, H, K]``, ``K = D / H``),
``v = x W_v`` (``[B, T, H, V]``, ``V = expand_v * D / H``), with
``use_short_conv`` each projection first through a short convolution with
SiLU (as flash-linear-attention's ``MultiScaleRetention``); head ``h``
retains with the fixed decay ``gamma_h = 1 - 2 ** (-5 - h)``:

    S_t = gamma_h S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t / sqrt(K)

then ``y = (swish(x W_G) * GroupNorm(o)) W_O`` with one normalization group
per head. The rotation by absolute position plays the part of the paper's
xPos phase ``e^{i n theta}`` (the decay is applied by the recurrence).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import (Context, MatrixStateMixer, OpForms,
                                      checked_impl)
from lin_attn_jax.layers.linear_attn import head_dim
from lin_attn_jax.ops import (chunk_retention, parallel_retention,
                              recurrent_retention, retention_step)

RETENTION_FORMS = OpForms(chunk_retention, parallel_retention,
                          recurrent_retention, retention_step)


def xavier_uniform(gain: float):
  """Glorot uniform times ``gain``: bound ``gain * sqrt(6 / (in + out))``."""
  return nnx.initializers.variance_scaling(gain ** 2, "fan_avg", "uniform")


class RetNet(MatrixStateMixer):
  """Multi-scale retention with a swish output gate.

  Initialisation as in the paper's code (torchscale): Xavier uniform with
  gain ``2 ** -2.5`` for ``W_q, W_k, W_v, W_G`` and ``2 ** -1`` for ``W_O``;
  the GroupNorm scale starts at one. The cache is the retention state
  ``[B, H, K, V]`` float32.

  Args:
    d_model: ``D``. n_heads: ``H``; ``D / H`` must be even (rotary pairs).
    expand_v: value width per head is ``expand_v * D / H`` (2 in the paper).
    use_short_conv: pass q, k and v each through a depthwise causal
      convolution with SiLU right after its projection, before the rotation
      (``modules.QKVShortConv``; False, as fla's default).
    conv_size: taps of the short convolutions (4).
    conv_bias: the short convolutions have a bias (False).
    chunk_size: chunk length of the chunk form (speed only).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the chunk form's
      implementation (``lin_attn_jax.ops.common.dispatch``).
    causal: False for the non-causal layer: every token reads its
      whole document in both directions (``Mixer.set_causal``).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               expand_v: float = 2.0, use_short_conv: bool = False,
               conv_size: int = 4, conv_bias: bool = False,
               chunk_size: int = 64, impl: str = "auto",
               causal: bool = True, dtype=jnp.float32,
               param_dtype=jnp.float32):
    self.set_causal(causal)
    value_dim = int(d_model * expand_v)
    self.n_heads, self.chunk_size = n_heads, chunk_size
    self.impl = checked_impl(impl)
    self.head_k = head_dim(d_model, n_heads, "d_model")
    self.head_v = head_dim(value_dim, n_heads, "expand_v * d_model")
    if self.head_k % 2:
      raise ValueError(f"rotary embeddings need an even key width per head; "
                       f"d_model / n_heads = {self.head_k}")
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    small = xavier_uniform(2 ** -2.5)
    self.q_proj = modules.dense(d_model, d_model, kernel_init=small, **kw)
    self.k_proj = modules.dense(d_model, d_model, kernel_init=small, **kw)
    self.v_proj = modules.dense(d_model, value_dim, kernel_init=small, **kw)
    self.short_conv = modules.qkv_short_conv(
        use_short_conv, (d_model, d_model, value_dim), conv_size, conv_bias,
        rngs=rngs, param_dtype=param_dtype)
    self.g_proj = modules.dense(d_model, value_dim, kernel_init=small, **kw)
    self.norm = modules.HeadNorm(n_heads, self.head_v, rngs=rngs, kind="layer",
                                 param_dtype=param_dtype)
    self.o_proj = modules.dense(value_dim, d_model, ("heads", "embed"),
                                kernel_init=xavier_uniform(2 ** -1), **kw)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h = self.n_heads
    (q, k, v), conv, cache = self.short_convolved(
        self.q_proj(x), self.k_proj(x), self.v_proj(x), ctx)
    q = modules.rotary(q.reshape(b, t, h, self.head_k),
                       ctx.positions)                           # [B, T, H, K]
    k = modules.rotary(k.reshape(b, t, h, self.head_k),
                       ctx.positions)                           # [B, T, H, K]
    v = v.reshape(b, t, h, self.head_v)                         # [B, T, H, V]
    # S_t = gamma_h S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t / sqrt(K)
    o, state = self.apply_forms(ctx, RETENTION_FORMS, dict(q=q, k=k, v=v),
                                cache)                          # [B, T, H, V]
    y = self.o_proj(self.norm(o, self.g_proj(x)))               # [B, T, D]
    return y, self.joined_cache(conv, state)
