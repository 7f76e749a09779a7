"""The reference recurrence of HGRN."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.hgrn.inputs import validate

_F32 = jnp.float32


def naive_recurrent_hgrn(x, g, *, initial_state=None, output_final_state=False,
                         segment_ids=None):
  """Reference recurrence. Shapes as in ``chunk_hgrn``."""
  batch, length, width = validate(x, g, initial_state, segment_ids)
  reset = reset_flags(segment_ids, batch, length)

  def step(h, inputs):
    x_t, g_t, reset_t = inputs
    h = jnp.where(reset_t[:, None], 0.0, h)
    h = jnp.exp(g_t) * h + x_t
    return h, h

  xs = [jnp.moveaxis(jnp.asarray(v, _F32), 1, 0) for v in (x, g)]
  state, h = jax.lax.scan(step, initial(initial_state, (batch, width)),
                          (*xs, reset.T))
  h = jnp.moveaxis(h, 0, 1).astype(x.dtype)
  return h, (state if output_final_state else None)
