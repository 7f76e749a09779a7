"""Comba split over a ``sequence`` mesh axis.

The delta-rule core's scheme (``delta_rule/context_parallel.py``): the
transition ``exp(g_t) I - beta_t k_t p_t^T`` does not depend on the
values, so one run of the chunk form with ``K`` extra value columns (zero
values) gives each device's outputs and final state from zero, its ``K x
K`` transition and how each output reads the entering state; an all-gather
and a prefix combine give that state.
"""

from __future__ import annotations

from lin_attn_jax.ops.comba import chunk
from lin_attn_jax.ops.comba.inputs import validate
from lin_attn_jax.ops.common import context_parallel as cp


def context_parallel_comba(q, k, v, p, g, beta, *, scale=None,
                           initial_state=None, output_final_state=False,
                           segment_ids=None, chunk_size=64, sub_chunk_size=8,
                           use_qk_l2norm=False, impl="auto",
                           axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_comba`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_comba``, plus ``axis_name`` and
  ``mesh`` as in ``context_parallel_delta_rule``. ``chunk_comba`` calls this
  itself when the current mesh has a ``"sequence"`` axis of size > 1.
  """
  _, t, _, _, dk, _, _ = validate(q, k, v, p, g, beta, initial_state,
                                  segment_ids)
  return cp.split_state_read_form(
      chunk.chunk_comba, (q, k, v, p, g, beta), value_index=2, length=t,
      key_dim=dk, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      axis_name=axis_name, mesh=mesh, scale=scale, chunk_size=chunk_size,
      sub_chunk_size=sub_chunk_size, use_qk_l2norm=use_qk_l2norm, impl=impl)
