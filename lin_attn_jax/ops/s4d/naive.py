"""The reference recurrence of S4D."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.s4d.complex_state import (complex_state, discretize,
                                                to_complex, to_pair)
from lin_attn_jax.ops.s4d.inputs import validate

_F32 = jnp.float32


def naive_recurrent_s4d(u, log_dt, A_real, A_imag, B, C, *, D=None,
                        initial_state=None, output_final_state=False,
                        segment_ids=None):
  """Reference recurrence, complex arithmetic. Shapes as in ``chunk_s4d``."""
  batch, length, channels, n_modes = validate(
      u, log_dt, A_real, A_imag, B, C, D, initial_state, segment_ids)
  dt_a, b_bar = discretize(log_dt, A_real, A_imag, B)
  decay = jnp.exp(dt_a)                                          # [D, N]
  c = to_complex(C)
  reset = reset_flags(segment_ids, batch, length)

  def step(x, inputs):
    u_t, reset_t = inputs                                        # [B, D], [B]
    x = jnp.where(reset_t[:, None, None], 0.0, x)
    x = decay * x + b_bar * u_t[..., None]
    return x, 2.0 * jnp.real(jnp.sum(c * x, axis=-1))

  h0 = complex_state(initial_state, (batch, channels, n_modes))
  x, y = jax.lax.scan(step, h0,
                      (jnp.moveaxis(jnp.asarray(u, _F32), 1, 0), reset.T))
  y = jnp.moveaxis(y, 0, 1)
  if D is not None:
    y = y + jnp.asarray(D, _F32) * jnp.asarray(u, _F32)
  return y.astype(u.dtype), (to_pair(x) if output_final_state else None)
