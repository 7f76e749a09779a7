"""The quadratic form: ``parallel_gated_linear`` on the stabilised inputs."""

from __future__ import annotations

from lin_attn_jax.ops.gated_linear import parallel_gated_linear
from lin_attn_jax.ops.mlstm.inputs import EPS
from lin_attn_jax.ops.mlstm.on_core import run_on_core


def parallel_mlstm(q, k, v, i, f, *, scale=None, eps=EPS, initial_state=None,
                   output_final_state=False, segment_ids=None):
  """The mLSTM with ``[T, T]`` decay-weighted scores (the max state from
  its scan, then ``parallel_gated_linear``); arguments and result as in
  ``naive_recurrent_mlstm``."""
  return run_on_core(parallel_gated_linear, q, k, v, i, f, scale=scale,
                     eps=eps, initial_state=initial_state,
                     output_final_state=output_final_state,
                     segment_ids=segment_ids)
