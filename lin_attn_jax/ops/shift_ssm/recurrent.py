"""The token-by-token form: ``shift_ssm_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.conv.convolutions import initial_window
from lin_attn_jax.ops.shift_ssm.inputs import validate
from lin_attn_jax.ops.shift_ssm.step import shift_ssm_step

_F32 = jnp.float32


def recurrent_shift_ssm(u, C, *, D=None, initial_state=None,
                        output_final_state=False, segment_ids=None):
  """``shift_ssm_step`` scanned over time. Shapes as in the chunk form."""
  batch, length, channels, n_state = validate(u, C, D, initial_state,
                                              segment_ids)
  window0 = initial_window(initial_state, batch, n_state, channels)
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  C = jnp.asarray(C, _F32)
  D = None if D is None else jnp.asarray(D, _F32)

  def step(window, inputs):
    u_t, reset_t = inputs
    y_t, window = shift_ssm_step(u_t, C, window, D=D, reset=reset_t)
    return window, y_t

  window, y = jax.lax.scan(
      step, window0,
      (jnp.moveaxis(u, 1, 0), reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(y, 0, 1), (window if output_final_state else None)
