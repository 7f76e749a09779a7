"""The token-by-token form: ``linear_scan_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import initial, validate
from lin_attn_jax.ops.diagonal_ssm.step import linear_scan_step


def recurrent_linear_scan(a, b, *, initial_state=None, output_final_state=False,
                          segment_ids=None):
  """``linear_scan_step`` scanned over time. Shapes as in the chunk form."""
  batch, length, width = validate(a, b, initial_state, segment_ids)
  state = initial(initial_state, (batch, width))

  def step(h, inputs):
    a_t, b_t, reset_t = inputs
    out, h = linear_scan_step(a_t, b_t, h, reset=reset_t)
    return h, out

  xs = [jnp.moveaxis(x, 1, 0) for x in (a, b)]
  state, h = jax.lax.scan(step, state,
                          (*xs, reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(h, 0, 1), (state if output_final_state else None)
