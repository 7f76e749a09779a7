"""The quadratic form: ``parallel_gated_linear`` under the mapping of
``on_core.py``."""

from __future__ import annotations

from lin_attn_jax.ops.gated_linear import parallel_gated_linear
from lin_attn_jax.ops.mamba3.on_core import run_mimo_on_core, run_on_core


def parallel_mamba3(q, k, v, g, dt, trap, angles, *, initial_state=None,
                    output_final_state=False, segment_ids=None):
  """Mamba-3 as masked ``[T, T]`` scores ``(q~_t . k~_s) w_s exp(g_{s+1}
  + ... + g_t)``, less the pending write on the diagonal; arguments and
  result as in ``naive_recurrent_mamba3``."""
  return run_on_core(parallel_gated_linear, q, k, v, g, dt, trap, angles,
                     initial_state=initial_state,
                     output_final_state=output_final_state,
                     segment_ids=segment_ids)


def parallel_mamba3_mimo(q, k, v, g, dt, trap, angles, *, initial_state=None,
                         output_final_state=False, segment_ids=None):
  """Mamba-3 MIMO as masked ``[R T, R T]`` scores over the sub-steps of
  ``on_core.py``; arguments and result as in
  ``naive_recurrent_mamba3_mimo``."""
  return run_mimo_on_core(parallel_gated_linear, q, k, v, g, dt, trap, angles,
                          initial_state=initial_state,
                          output_final_state=output_final_state,
                          segment_ids=segment_ids)
