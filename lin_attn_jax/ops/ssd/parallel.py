"""SSD's quadratic form: the gated-linear core's."""

from __future__ import annotations

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.gated_linear import parallel_gated_linear
from lin_attn_jax.ops.ssd.bidirectional import noncausal_ssd
from lin_attn_jax.ops.ssd.inputs import add_skip, to_gated_linear, validate


def parallel_ssd(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=False,
                 initial_state=None, output_final_state=False,
                 segment_ids=None, causal=True):
  """The quadratic masked form ``y = (L * C B^T) (x dt) + D x`` with
  ``L[i, j] = exp(sum_{j < m <= i} dt_m A)``: ``parallel_gated_linear`` under
  the mapping of ``chunk_ssd``. Shapes as in ``chunk_ssd``.
  """
  validate(x, dt, A, B, C, D, dt_bias, dt_softplus, initial_state, segment_ids)
  check_no_state("parallel_ssd", causal, initial_state,
                 output_final_state)
  if not causal:
    return noncausal_ssd(parallel_gated_linear, x, dt, A, B, C, D=D,
                         dt_bias=dt_bias, dt_softplus=dt_softplus,
                         segment_ids=segment_ids)
  q, k, v, g = to_gated_linear(x, dt, A, B, C, dt_bias, dt_softplus)
  o, final = parallel_gated_linear(q, k, v, g, scale=1.0,
                                   initial_state=initial_state,
                                   output_final_state=output_final_state,
                                   segment_ids=segment_ids)
  return add_skip(o, x, D).astype(x.dtype), final
