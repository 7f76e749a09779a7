"""Token-by-token forms of the linear scan: one step and its ``lax.scan``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import (initial, validate,
                                                  validate_step)


def linear_scan_step(a, b, state=None, *, reset=None):
  """One decoding step, O(1) in the context length.

  Args:
    a, b: ``[B, D]``.
    state: ``[B, D]`` float32 ``h_{t-1}``, or None for zeros.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(h_t [B, D] in b's dtype, h_t [B, D] float32)``.
  """
  batch, width = validate_step(a, b, state, reset)
  h = initial(state, (batch, width))
  if reset is not None:
    h = jnp.where(jnp.asarray(reset)[:, None], 0.0, h)
  h = jnp.asarray(a, jnp.float32) * h + jnp.asarray(b, jnp.float32)
  return h.astype(b.dtype), h


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
