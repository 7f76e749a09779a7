"""LFM2's gated short convolution (Liquid AI's LFM2; transformers'
``Lfm2ShortConv``), a token mixer of its own.

One projection gives three ``D``-wide streams ``B, C, x``; the input gate
``B x`` goes through a depthwise causal convolution of ``L`` taps and the
output gate ``C`` multiplies the result::

    B, C, x = split(x W_in)
    y = (C * conv(B * x)) W_out

No activation, no normalisation. Its only state is the last ``L - 1``
gated inputs. Every mode runs the causal convolution op
(``ops.chunk_causal_conv1d`` and its forms), which over a ``"sequence"``
mesh axis exchanges a halo of ``L - 1`` tokens with the previous device.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer


class GatedShortConv(Mixer):
  """The gated short convolution (see the module docstring).

  Args:
    d_model: ``D``. n_heads: not used (the convolution is per channel); the
      argument keeps the mixers' common signature.
    conv_size: ``L``, the taps (3, LFM2's ``conv_L_cache``).
    bias: the projections and the convolution have biases (False, LFM2's
      ``conv_bias``).

  Initialisation: the projections LeCun normal, the taps as PyTorch's
  ``Conv1d`` (uniform in ``+-1/sqrt(L)``, ``modules.ShortConv``).

  Parameters against transformers' ``Lfm2ShortConv`` (a kernel is the
  transpose of a ``Linear`` weight):

  - ``in_proj.kernel [D, 3 D]``: ``in_proj.weight [3 D, D]`` (rows ``B``,
    then ``C``, then ``x``), ``in_proj.bias [3 D]``;
  - ``conv.weight [D, L]``: ``conv.weight [D, 1, L]`` (the last tap
    multiplies the current token), ``conv.bias [D]``;
  - ``out_proj.kernel [D, D]``: ``out_proj.weight``, ``out_proj.bias``.

  Cache: ``[B, L - 1, D]`` float32, the last gated inputs ``B * x``.
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               conv_size: int = 3, bias: bool = False, dtype=jnp.float32,
               param_dtype=jnp.float32):
    del n_heads
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.d_model = d_model
    self.in_proj = modules.dense(d_model, 3 * d_model, use_bias=bias, **kw)
    self.conv = modules.ShortConv(d_model, conv_size, rngs=rngs,
                                  activation=None, use_bias=bias,
                                  param_dtype=param_dtype)
    self.out_proj = modules.dense(d_model, d_model, ("heads", "embed"),
                                  use_bias=bias, **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return self.conv.init_state(batch_size)

  def recurrent_state_floats(self, seq_len):
    """The window of the convolution, ``(L - 1) x D``: the layer's only
    state (counted here, not as a convolution buffer, since it is all the
    layer remembers)."""
    del seq_len
    return (self.conv.width - 1) * self.d_model

  def chunk_options(self) -> dict:
    return {}

  def mix(self, x, ctx: Context):
    d = self.d_model
    b_gate, c_gate, xs = self.in_proj.parts(x, [d, 2 * d])     # [B, T, D] each
    bias = None if self.conv.bias is None else self.conv.bias[...]
    # y = C * conv(B * x)
    y, cache = self.apply_forms(ctx, modules.CAUSAL_CONV1D,
                                {"x": b_gate * xs}, ctx.cache,
                                weight=self.conv.weight[...], bias=bias,
                                activation=None)               # [B, T, D]
    return self.out_proj(c_gate * y), cache
