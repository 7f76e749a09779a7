"""The token-by-token form: ``linear_scan_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.bidirectional import lion_scan
from lin_attn_jax.ops.diagonal_ssm.inputs import initial, validate
from lin_attn_jax.ops.diagonal_ssm.step import linear_scan_step


def recurrent_noncausal_scan(a, b, segment_ids):
  """The causal token-by-token states from zero, as ``lion_scan`` calls
  it."""
  return recurrent_linear_scan(a, b, segment_ids=segment_ids)[0]


def recurrent_linear_scan(a, b, *, initial_state=None, output_final_state=False,
                          segment_ids=None, causal=True):
  """``linear_scan_step`` scanned over time. Shapes as in the chunk form
  (``causal=False``: forward and backward, ``bidirectional.py``)."""
  batch, length, width = validate(a, b, initial_state, segment_ids)
  check_no_state("recurrent_linear_scan", causal, initial_state,
                 output_final_state)
  if not causal:
    return lion_scan(recurrent_noncausal_scan, a, b,
                     segment_ids).astype(b.dtype), None
  state = initial(initial_state, (batch, width))

  def step(h, inputs):
    a_t, b_t, reset_t = inputs
    out, h = linear_scan_step(a_t, b_t, h, reset=reset_t)
    return h, out

  xs = [jnp.moveaxis(x, 1, 0) for x in (a, b)]
  state, h = jax.lax.scan(step, state,
                          (*xs, reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(h, 0, 1), (state if output_final_state else None)
