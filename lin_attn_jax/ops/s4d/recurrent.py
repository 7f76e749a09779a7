"""The token-by-token form: ``s4d_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.s4d.inputs import validate
from lin_attn_jax.ops.s4d.step import s4d_step

_F32 = jnp.float32


def recurrent_s4d(u, log_dt, A_real, A_imag, B, C, *, D=None,
                  initial_state=None, output_final_state=False,
                  segment_ids=None):
  """``s4d_step`` scanned over time. Shapes as in ``chunk_s4d``."""
  batch, length, channels, n_modes = validate(
      u, log_dt, A_real, A_imag, B, C, D, initial_state, segment_ids)
  state = (jnp.zeros((batch, channels, n_modes, 2), _F32)
           if initial_state is None else jnp.asarray(initial_state, _F32))
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  log_dt, A_real, A_imag, B, C, D = (
      None if p is None else jnp.asarray(p, _F32)
      for p in (log_dt, A_real, A_imag, B, C, D))

  def step(state, inputs):
    u_t, reset_t = inputs
    y_t, state = s4d_step(u_t, log_dt, A_real, A_imag, B, C, state, D=D,
                          reset=reset_t)
    return state, y_t

  state, y = jax.lax.scan(
      step, state,
      (jnp.moveaxis(u, 1, 0), reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(y, 0, 1), (state if output_final_state else None)
