"""The definition of the linear scan, one token at a time.

    h_t = a_t * h_{t-1} + b_t        elementwise over [B, D]

At a document boundary (``segment_ids`` changes) ``h_{t-1}`` is replaced by
0. Float32, written for reading; every other form is tested against it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.bidirectional import lion_definition
from lin_attn_jax.ops.diagonal_ssm.inputs import initial, validate


def naive_recurrent_linear_scan(a, b, *, initial_state=None,
                                output_final_state=False, segment_ids=None,
                                causal=True):
  """Reference recurrence. Shapes as in ``chunk_linear_scan``; with
  ``causal=False`` the dense non-causal definition (``bidirectional.py``).
  """
  batch, length, width = validate(a, b, initial_state, segment_ids)
  check_no_state("naive_recurrent_linear_scan", causal, initial_state,
                 output_final_state)
  if not causal:
    return lion_definition(a, b, segment_ids).astype(b.dtype), None
  state = initial(initial_state, (batch, width))
  reset = reset_flags(segment_ids, batch, length)

  def step(h, inputs):
    a_t, b_t, reset_t = inputs                               # [B, D], [B]
    h = jnp.where(reset_t[:, None], 0.0, h)
    h = a_t * h + b_t
    return h, h

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0) for x in (a, b)]
  state, h = jax.lax.scan(step, state, (*time_major, reset.T))
  h = jnp.moveaxis(h, 0, 1).astype(b.dtype)                  # [B, T, D]
  return h, (state if output_final_state else None)
