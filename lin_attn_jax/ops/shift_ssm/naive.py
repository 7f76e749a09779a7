"""The reference recurrence of the shift SSM."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.conv.convolutions import initial_window
from lin_attn_jax.ops.shift_ssm.inputs import validate
from lin_attn_jax.ops.shift_ssm.taps import skip

_F32 = jnp.float32


def naive_recurrent_shift_ssm(u, C, *, D=None, initial_state=None,
                              output_final_state=False, segment_ids=None):
  """Reference: the shift register ``x_t = [u_t, x_{t-1}[:-1]]``."""
  batch, length, channels, n_state = validate(u, C, D, initial_state,
                                              segment_ids, direct=False)
  window0 = initial_window(initial_state, batch, n_state, channels)
  C = jnp.asarray(C, _F32)
  # The register x_{t-1}, newest first: [B, N, D] with x[:, 0] = u_{t-1}; its
  # oldest entry is not part of the state (it is shifted out before a read).
  register = jnp.concatenate(
      [jnp.flip(window0, axis=1),
       jnp.zeros((batch, 1, channels), _F32)], axis=1)
  reset = reset_flags(segment_ids, batch, length)

  def step(register, inputs):
    u_t, reset_t = inputs
    register = jnp.where(reset_t[:, None, None], 0.0, register)
    register = jnp.concatenate([u_t[:, None], register[:, :-1]], axis=1)
    return register, jnp.sum(C.T * register, axis=1)            # [B, D]

  register, y = jax.lax.scan(
      step, register, (jnp.moveaxis(jnp.asarray(u, _F32), 1, 0), reset.T))
  y = skip(jnp.moveaxis(y, 0, 1), u, D)
  final = jnp.flip(register[:, :-1], axis=1) if output_final_state else None
  return y.astype(u.dtype), final
