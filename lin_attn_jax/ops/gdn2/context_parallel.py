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
  cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  options = dict(scale=scale, chunk_size=chunk_size,
                 sub_chunk_size=sub_chunk_size, use_qk_l2norm=use_qk_l2norm,
                 impl=impl)

  def device(split, whole):
    q, k, v, g, b, w, ids = split
    (initial,) = whole
    # The extra value columns are zeros: their write gate is immaterial.
    w_read = jnp.concatenate(
        [jnp.asarray(w, jnp.float32),
         jnp.ones(w.shape[:-1] + (dk,), jnp.float32)], axis=-1)
    o, final = cp.split_with_state_read(
        lambda values, state0: chunk.chunk_gdn2(
            q, k, values, g, b, w_read, initial_state=state0,
            output_final_state=True, segment_ids=ids, **options),
        v, dk, initial, ids, axis_name=axis_name)
    return o, (final if output_final_state else None)

  return cp.map_sequence(device, (q, k, v, g, b, w, segment_ids),
                         (initial_state,), axis_name=axis_name, mesh=mesh)
