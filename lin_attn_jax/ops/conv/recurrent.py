"""The token-by-token form: ``causal_conv1d_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.conv.convolutions import initial_window
from lin_attn_jax.ops.conv.inputs import validate
from lin_attn_jax.ops.conv.step import causal_conv1d_step

_F32 = jnp.float32


def recurrent_causal_conv1d(x, weight, bias=None, *, activation=None,
                            initial_state=None, output_final_state=False,
                            segment_ids=None):
  """``causal_conv1d_step`` scanned over time. Shapes as in the chunk form."""
  batch, length, channels, taps = validate(x, weight, bias, activation,
                                           initial_state, segment_ids)
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  weight = jnp.asarray(weight, _F32)
  bias = None if bias is None else jnp.asarray(bias, _F32)

  def step(window, inputs):
    x_t, reset_t = inputs
    y_t, window = causal_conv1d_step(x_t, weight, bias, window,
                                     activation=activation, reset=reset_t)
    return window, y_t

  window, y = jax.lax.scan(
      step, initial_window(initial_state, batch, taps, channels),
      (jnp.moveaxis(x, 1, 0), reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(y, 0, 1), (window if output_final_state else None)
