"""One decoding step of the causal convolution."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.conv.convolutions import conv_step, initial_window
from lin_attn_jax.ops.conv.inputs import finish, validate_step

_F32 = jnp.float32


def causal_conv1d_step(x, weight, bias=None, state=None, *, activation=None,
                       reset=None):
  """One decoding step, O(W) work.

  Args:
    x: ``[B, D]``; weight: ``[D, W]``; bias: ``[D]`` or None.
    state: ``[B, W - 1, D]`` float32, the last ``W - 1`` inputs, or None.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(y [B, D] in x's dtype, new state [B, W - 1, D] float32)``.
  """
  batch, channels, taps = validate_step(x, weight, bias, activation, state,
                                        reset)
  y, window = conv_step(jnp.asarray(x, _F32), jnp.asarray(weight, _F32),
                        initial_window(state, batch, taps, channels), reset)
  return finish(y, bias, activation).astype(x.dtype), window
