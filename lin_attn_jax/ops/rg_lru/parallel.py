"""The RG-LRU as one associative scan over time."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.diagonal_ssm.parallel import parallel_noncausal_scan
from lin_attn_jax.ops.diagonal_ssm.parallel import parallel_scan_f32
from lin_attn_jax.ops.diagonal_ssm.scan import keep_flags
from lin_attn_jax.ops.rg_lru.bidirectional import noncausal_rg_lru
from lin_attn_jax.ops.rg_lru.coefficients import rg_lru_coefficients
from lin_attn_jax.ops.rg_lru.inputs import validate

_F32 = jnp.float32


def parallel_rg_lru(x, a_gate, x_gate, a_param, *, c=8.0, initial_state=None,
                    output_final_state=False, segment_ids=None, unscaled=None,
                    causal=True):
  """``parallel_linear_scan`` of the RG-LRU coefficients."""
  batch, _ = validate(x, a_gate, x_gate, a_param, initial_state, segment_ids,
                      step=False, unscaled=unscaled)
  check_no_state("parallel_rg_lru", causal, initial_state, output_final_state)
  if not causal:
    return noncausal_rg_lru(parallel_noncausal_scan, x, a_gate, x_gate,
                            a_param, c=c, segment_ids=segment_ids,
                            unscaled=unscaled)
  a, b = rg_lru_coefficients(x, a_gate, x_gate, a_param, c, unscaled)
  h0 = None if initial_state is None else jnp.asarray(initial_state, _F32)
  h, final = parallel_scan_f32(a, b, keep_flags(segment_ids, batch,
                                                x.shape[1]), h0)
  return h.astype(x.dtype), (final if output_final_state else None)
