"""RWKV-7 split over a ``sequence`` mesh axis.

The same scheme as the delta rule (``delta_rule/context_parallel.py``): the
transition ``diag(exp(w_t)) + b_t a_t^T`` does not depend on the values, so
one run of the chunk form with ``K`` extra value columns gives each device's
outputs and final state from zero, its ``K x K`` transition and how each
output reads the entering state; an all-gather and a prefix combine give
that state.
"""

from __future__ import annotations

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.rwkv7 import chunk
from lin_attn_jax.ops.rwkv7.inputs import validate


def context_parallel_rwkv7(r, w, k, v, a, b, *, scale=None,
                           initial_state=None, output_final_state=False,
                           segment_ids=None, chunk_size=64, sub_chunk_size=8,
                           min_log_decay=None, axis_name=cp.SEQUENCE_AXIS,
                           mesh=None):
  """``chunk_rwkv7`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_rwkv7``, plus ``axis_name`` and
  ``mesh`` as in ``context_parallel_delta_rule``. ``chunk_rwkv7`` calls
  this itself when the current mesh has a ``"sequence"`` axis of size > 1.
  """
  _, t, _, dk, _ = validate(r, w, k, v, a, b, initial_state, segment_ids)
  return cp.split_state_read_form(
      chunk.chunk_rwkv7, (r, w, k, v, a, b), value_index=3, length=t,
      key_dim=dk, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      axis_name=axis_name, mesh=mesh, scale=scale, chunk_size=chunk_size,
      sub_chunk_size=sub_chunk_size, min_log_decay=min_log_decay)
