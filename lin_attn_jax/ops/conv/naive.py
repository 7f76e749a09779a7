"""The reference form of the causal convolution."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.conv.convolutions import initial_window
from lin_attn_jax.ops.conv.inputs import finish, validate

_F32 = jnp.float32


def naive_recurrent_causal_conv1d(x, weight, bias=None, *, activation=None,
                                  initial_state=None, output_final_state=False,
                                  segment_ids=None):
  """Reference: a window of the last W inputs slid one token at a time."""
  batch, length, channels, taps = validate(x, weight, bias, activation,
                                           initial_state, segment_ids)
  weight_f = jnp.asarray(weight, _F32)
  window = initial_window(initial_state, batch, taps, channels)  # [B,W-1,D]
  reset = reset_flags(segment_ids, batch, length)

  def step(window, inputs):
    x_t, reset_t = inputs                                       # [B, D], [B]
    window = jnp.where(reset_t[:, None, None], 0.0, window)
    full = jnp.concatenate([window, x_t[:, None]], axis=1)      # [B, W, D]
    y_t = jnp.sum(full * weight_f.T, axis=1)                    # [B, D]
    return full[:, 1:], y_t

  window, y = jax.lax.scan(
      step, window, (jnp.moveaxis(jnp.asarray(x, _F32), 1, 0), reset.T))
  y = finish(jnp.moveaxis(y, 0, 1), bias, activation)
  return y.astype(x.dtype), (window if output_final_state else None)
