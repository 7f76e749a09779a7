"""The token-by-token form: ``recurrent_gated_linear`` under the mapping
of ``on_core.py``."""

from __future__ import annotations

from lin_attn_jax.ops.gated_linear import recurrent_gated_linear
from lin_attn_jax.ops.mamba3.on_core import run_mimo_on_core, run_on_core


def recurrent_mamba3(q, k, v, g, dt, trap, angles, *, initial_state=None,
                     output_final_state=False, segment_ids=None):
  """The core's scan over tokens on ``(q~, k', v, g)``; arguments and
  result as in ``naive_recurrent_mamba3``."""
  return run_on_core(recurrent_gated_linear, q, k, v, g, dt, trap, angles,
                     initial_state=initial_state,
                     output_final_state=output_final_state,
                     segment_ids=segment_ids)


def recurrent_mamba3_mimo(q, k, v, g, dt, trap, angles, *,
                          initial_state=None, output_final_state=False,
                          segment_ids=None):
  """The core's scan over the ``R T`` sub-steps of ``on_core.py``;
  arguments and result as in ``naive_recurrent_mamba3_mimo``."""
  return run_mimo_on_core(recurrent_gated_linear, q, k, v, g, dt, trap,
                          angles, initial_state=initial_state,
                          output_final_state=output_final_state,
                          segment_ids=segment_ids)
