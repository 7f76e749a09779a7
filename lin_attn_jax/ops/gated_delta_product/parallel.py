"""The quadratic form of Gated DeltaProduct: ``parallel_delta_rule`` on the
interleaved sub-steps."""

from __future__ import annotations

from lin_attn_jax.ops.delta_rule.parallel import parallel_delta_rule
from lin_attn_jax.ops.gated_delta_product.inputs import on_core, validate


def parallel_gated_delta_product(q, k, v, g, beta, *, scale=None,
                                 initial_state=None, output_final_state=False,
                                 segment_ids=None, use_qk_l2norm=False):
  """Quadratic form: one ``[T N, T N]`` triangular solve over the interleaved
  sub-steps (``inputs.interleave``), for checking and short inputs.

  Arguments and result as in ``naive_recurrent_gated_delta_product``.
  """
  validate(q, k, v, g, beta, initial_state, segment_ids)
  return on_core(parallel_delta_rule, q, k, v, g, beta, scale=scale,
                 initial_state=initial_state,
                 output_final_state=output_final_state,
                 segment_ids=segment_ids, use_qk_l2norm=use_qk_l2norm)
