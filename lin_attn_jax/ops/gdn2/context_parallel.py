"""Gated DeltaNet-2 split over a ``sequence`` mesh axis.

The delta-rule core's scheme (``delta_rule/context_parallel.py``): the
transition ``(I - k_t (b_t * k_t)^T) diag(exp(g_t))`` does not depend on the
values or the write gate, so one run of the chunk form with ``K`` extra
value columns (zero values, a write gate of ones) gives each device's
outputs and final state from zero, its ``K x K`` transition and how each
output reads the entering state; an all-gather and a prefix combine give
that state.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.gdn2 import chunk
from lin_attn_jax.ops.gdn2.inputs import validate


def context_parallel_gdn2(q, k, v, g, b, w, *, scale=None,
                          initial_state=None, output_final_state=False,
                          segment_ids=None, chunk_size=64, sub_chunk_size=8,
                          use_qk_l2norm=False, impl="auto",
                          axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_gdn2`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_gdn2``, plus ``axis_name`` and
  ``mesh`` as in ``context_parallel_delta_rule``. ``chunk_gdn2`` calls this
  itself when the current mesh has a ``"sequence"`` axis of size > 1.
  """
  _, t, _, _, dk, _ = validate(q, k, v, g, b, w, initial_state, segment_ids)
  return cp.split_state_read_form(
      chunk.chunk_gdn2, (q, k, v, g, b, w), value_index=2, length=t,
      key_dim=dk, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      axis_name=axis_name, mesh=mesh, widen=_widen_write_gate, scale=scale,
      chunk_size=chunk_size, sub_chunk_size=sub_chunk_size,
      use_qk_l2norm=use_qk_l2norm, impl=impl)


def _widen_write_gate(inputs, key_dim):
  """w with ``key_dim`` columns of ones for the extra value columns (zeros:
  their write gate is immaterial)."""
  q, k, v, g, b, w = inputs
  w = jnp.concatenate([jnp.asarray(w, jnp.float32),
                       jnp.ones(w.shape[:-1] + (key_dim,), jnp.float32)],
                      axis=-1)                                  # [B,L,HV,V+K]
  return q, k, v, g, b, w
