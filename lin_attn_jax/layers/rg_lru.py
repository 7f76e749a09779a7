"""Griffin's recurrent block (De et al., 2024, arXiv:2402.19427), on RG-LRU.

Two branches of width ``W``: ``gelu(x W_1)``, and ``x W_2`` through a causal
depthwise convolution of ``conv_width`` taps and the Real-Gated Linear
Recurrent Unit; their product is projected back to ``D`` (section 2.4,
figure 2). The RG-LRU's recurrence and input gates are block-diagonal
linear maps of the convolution's output, one ``[W/H, W/H]`` block per head.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms
from lin_attn_jax.ops import (chunk_rg_lru, parallel_rg_lru, recurrent_rg_lru,
                              rg_lru_step)

RG_LRU_FORMS = OpForms(chunk_rg_lru, parallel_rg_lru, recurrent_rg_lru,
                       rg_lru_step)


def a_param_init(a_min: float, a_max: float, c: float):
  """``a_param`` such that ``a^c = exp(-c softplus(a_param))`` is uniform in
  ``[a_min, a_max]`` (``a = sigmoid(-a_param)``, the paper's
  ``sigma(Lambda)``).

  ``softplus(a_param) = -log(u) / c`` is small, so its inverse is taken as
  ``log(expm1(.))``.
  """

  def init(key, shape, dtype=jnp.float32):
    u = jax.random.uniform(key, shape, jnp.float32, a_min, a_max)
    return jnp.log(jnp.expm1(-jnp.log(u) / c)).astype(dtype)

  return init


class BlockDiagonalDense(nnx.Module):
  """``x W + b`` with ``W`` block-diagonal: one ``[W/H, W/H]`` block per head.

  Weights normal with variance ``1 / (W/H)`` (LeCun, per block), bias zero.
  """

  def __init__(self, width: int, n_heads: int, *, rngs: nnx.Rngs,
               dtype=jnp.float32, param_dtype=jnp.float32):
    self.n_heads, self.block = n_heads, width // n_heads
    self.dtype = dtype
    self.kernel = modules.param(
        rngs, nnx.initializers.normal(self.block ** -0.5),
        (n_heads, self.block, self.block), ("heads", None, None), param_dtype)
    self.bias = modules.param(rngs, nnx.initializers.zeros_init(),
                              (n_heads, self.block), ("heads", None),
                              param_dtype)

  def __call__(self, x):
    """``x: [B, T, W]`` -> ``[B, T, W]``."""
    b, t, _ = x.shape
    x = x.astype(self.dtype).reshape(b, t, self.n_heads,
                                     self.block)                # [B, T, H, W/H]
    y = jnp.einsum("bthi,hij->bthj", x,
                   self.kernel[...].astype(self.dtype))         # [B, T, H, W/H]
    y = y + self.bias[...].astype(self.dtype)
    return y.reshape(b, t, -1)                                  # [B, T, W]


class RGLRU(Mixer):
  """Griffin's recurrent block with the RG-LRU.

  ``a_t = sigmoid(Lambda) ** (c r_t)`` with ``r_t`` the recurrence gate and
  ``c = 8``; ``h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t x_t)`` with ``i_t``
  the input gate (``lin_attn_jax.ops.rg_lru``). The gates are block-diagonal
  per head as in the paper (``BlockDiagonalDense``).

  Initialisation: ``Lambda`` such that ``a^c`` is uniform in ``[a_min,
  a_max] = [0.9, 0.999]`` (stored as ``a_param = -Lambda``); the gates'
  blocks LeCun normal with zero biases; the projections LeCun normal; the
  convolution as in ``modules.ShortConv`` (with a bias, no activation).

  Args:
    d_model: ``D``. n_heads: ``H``, the blocks of the gates.
    lru_width: ``W``, the width of the recurrence, or None for ``expand *
      D`` rounded up to a multiple of ``H``.
    expand: ``W / D`` when ``lru_width`` is None (4/3, about the ratio of
      the paper's models).
    conv_width: taps of the short convolution (4).
    c: the constant of the recurrence gate's exponent (8).
    a_min, a_max: range of ``a^c`` at initialisation (0.9, 0.999).
    use_bias: the two input projections and the output projection have
      biases (False; RecurrentGemma's have them).
    scale_first_token: scale the input by ``sqrt(1 - a_t^2)`` at every token,
      as the paper's equation (4) states (True); False leaves it out at the
      first token of every document (absolute position 0, a change of
      segment id), as the reference implementations do (``recurrentgemma``,
      HuggingFace's RecurrentGemma; used when loading their checkpoints).
    chunk_size: chunk length of the chunk form (speed only).

  Cache: ``{"conv": [B, conv_width - 1, W], "lru": [B, W]}``, float32.
    causal: False for the non-causal layer: every token reads its
      whole document in both directions (``Mixer.set_causal``).
  """

  no_weight_decay = ("a_param",)

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               lru_width: int | None = None, expand: float = 4 / 3,
               conv_width: int = 4, c: float = 8.0, a_min: float = 0.9,
               a_max: float = 0.999, use_bias: bool = False,
               scale_first_token: bool = True, chunk_size: int = 64,
               causal: bool = True,
               dtype=jnp.float32, param_dtype=jnp.float32):
    self.set_causal(causal)
    if n_heads < 1:
      raise ValueError(f"n_heads must be >= 1, got {n_heads}")
    if lru_width is None:
      lru_width = n_heads * math.ceil(expand * d_model / n_heads)
    if lru_width < 1 or lru_width % n_heads:
      raise ValueError(f"lru_width = {lru_width} must be positive and divide "
                       f"into n_heads = {n_heads}")
    if not 0 < a_min <= a_max < 1:
      raise ValueError(f"need 0 < a_min <= a_max < 1, got a_min = {a_min}, "
                       f"a_max = {a_max}")
    if c <= 0 or conv_width < 1:
      raise ValueError(f"c must be > 0 and conv_width >= 1, got c = {c}, "
                       f"conv_width = {conv_width}")
    self.width, self.c, self.chunk_size = lru_width, c, chunk_size
    self.scale_first_token = scale_first_token
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.gate_proj = modules.dense(d_model, lru_width, use_bias=use_bias, **kw)
    self.in_proj = modules.dense(d_model, lru_width, use_bias=use_bias, **kw)
    self.conv = modules.ShortConv(lru_width, conv_width, rngs=rngs,
                                  activation=None, param_dtype=param_dtype)
    self.a_gate = BlockDiagonalDense(lru_width, n_heads, **kw)
    self.x_gate = BlockDiagonalDense(lru_width, n_heads, **kw)
    self.a_param = modules.param(rngs, a_param_init(a_min, a_max, c),
                                 (lru_width,), ("heads",), param_dtype)
    self.out_proj = modules.dense(lru_width, d_model, ("heads", "embed"),
                                  use_bias=use_bias, **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return {"conv": self.conv.init_state(batch_size),
            "lru": jnp.zeros((batch_size, self.width), jnp.float32)}

  def recurrent_state_floats(self, seq_len):
    """``W``, one float per channel of the recurrence."""
    del seq_len
    return self.width

  def conv_state_floats(self):
    return (self.conv.width - 1) * self.conv.channels

  def mix(self, x, ctx: Context):
    cache = ctx.cache
    gate = jax.nn.gelu(self.gate_proj(x), approximate=True)     # [B, T, W]
    u, conv_state = self.conv(self.in_proj(x), ctx,
                              None if cache is None else cache["conv"])
    a_gate, x_gate = self.a_gate(u), self.x_gate(u)             # [B, T, W]
    unscaled = None if self.scale_first_token else ctx.starts()  # [B, T]
    # a_t = sigmoid(Lambda) ** (c r_t),
    # h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t x_t)
    h, lru_state = self.apply_forms(
        ctx, RG_LRU_FORMS,
        dict(x=u, a_gate=a_gate, x_gate=x_gate, unscaled=unscaled),
        None if cache is None else cache["lru"], a_param=self.a_param[...],
        c=self.c)                                               # [B, T, W]
    y = self.out_proj(h * gate)                                 # [B, T, D]
    if cache is None:
      return y, None
    return y, {"conv": conv_state, "lru": lru_state}
