"""The delta-rule core split over a ``sequence`` mesh axis.

Each device runs the chunk form once (its Pallas sweep where ``impl`` picks
it) on its tokens from a zero state, with ``K`` extra value columns that start
from the identity (``run_with_state_read``): besides its outputs it gives its
final state ``R_p [B, HV, K, V]``, its ``K x K`` transition ``M_p`` (the
product of every token's ``(I - beta k k^T) diag(exp(g))``, cut to 0 where a
document starts inside the device) and, for every token, how its output reads
the state entering the device. One all-gather of the ``P`` pairs and a
prefix combine ``S_{p+1} = M_p S_p + R_p`` give that state, and one product
adds its contribution to the outputs. DeltaNet, Gated DeltaNet and KDA reach
it through ``chunk_delta_rule``.
"""

from __future__ import annotations

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.delta_rule import chunk
from lin_attn_jax.ops.delta_rule.inputs import validate


def context_parallel_delta_rule(q, k, v, beta, g=None, *, scale=None,
                                initial_state=None, output_final_state=False,
                                segment_ids=None, chunk_size=64,
                                sub_chunk_size=8, use_qk_l2norm=False,
                                impl="auto", axis_name=cp.SEQUENCE_AXIS,
                                mesh=None):
  """``chunk_delta_rule`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_delta_rule``, plus:
    axis_name: the mesh axis the sequence is split over (``P`` devices, T a
      multiple of ``P``).
    mesh: the mesh, or None for the current one (``jax.set_mesh``).

  ``chunk_delta_rule`` (so ``chunk_gated_delta_rule`` and ``chunk_kda``)
  calls this itself when the current mesh has a ``"sequence"`` axis of size
  > 1.
  """
  _, t, _, _, dk, _, _ = validate(q, k, v, beta, g, initial_state, segment_ids)
  return cp.split_state_read_form(
      chunk.chunk_delta_rule, (q, k, v, beta, g), value_index=2, length=t,
      key_dim=dk, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      axis_name=axis_name, mesh=mesh, scale=scale, chunk_size=chunk_size,
      sub_chunk_size=sub_chunk_size, use_qk_l2norm=use_qk_l2norm, impl=impl)
