"""The quadratic masked form, on the gated-linear core."""

from __future__ import annotations

from lin_attn_jax.ops.gated_linear import parallel_gated_linear
from lin_attn_jax.ops.log_linear_attn.terms import on_core


def parallel_log_linear_attn(q, k, v, g, level_scales, *, scale=None,
                             initial_state=None, output_final_state=False,
                             segment_ids=None, offset=0):
  """Log-linear attention as ``[T, T]`` decay-weighted scores: the sum over
  the block terms of ``parallel_gated_linear`` (``terms.py``), i.e. one
  quadratic form with the level-weighted mask ``lambda_t^(level(t,s))``.
  Arguments as in ``naive_recurrent_log_linear_attn``."""
  return on_core(parallel_gated_linear, q, k, v, g, level_scales,
                 scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state,
                 segment_ids=segment_ids, offset=offset)
