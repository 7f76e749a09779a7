"""The token-by-token form: ``selective_scan_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.diagonal_ssm.recurrent import (
    recurrent_noncausal_scan)
from lin_attn_jax.ops.mamba.bidirectional import noncausal_selective_scan
from lin_attn_jax.ops.mamba.inputs import validate
from lin_attn_jax.ops.mamba.step import selective_scan_step


def recurrent_selective_scan(u, delta, A, B, C, *, D=None, z=None,
                             delta_bias=None, delta_softplus=False,
                             initial_state=None, output_final_state=False,
                             segment_ids=None, causal=True):
  """``selective_scan_step`` scanned over time. Shapes as in the chunk form."""
  dims = validate(u, delta, A, B, C, D, z, delta_bias, initial_state,
                  segment_ids)
  check_no_state("recurrent_selective_scan", causal, initial_state,
                 output_final_state)
  if not causal:
    return noncausal_selective_scan(
        recurrent_noncausal_scan, u, delta, A, B, C, D=D, z=z,
        delta_bias=delta_bias, delta_softplus=delta_softplus,
        segment_ids=segment_ids, dims=dims)
  batch, length = u.shape[:2]
  state = initial(initial_state, (batch, dims.width, dims.state))
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  A, D, delta_bias = (None if p is None else jnp.asarray(p, jnp.float32)
                      for p in (A, D, delta_bias))

  def step(h, inputs):
    u_t, delta_t, b_t, c_t, z_t, reset_t = inputs
    y_t, h = selective_scan_step(u_t, delta_t, A, b_t, c_t, h, D=D, z=z_t,
                                 delta_bias=delta_bias,
                                 delta_softplus=delta_softplus, reset=reset_t)
    return h, y_t

  xs = [None if x is None else jnp.moveaxis(x, 1, 0)
        for x in (u, delta, B, C, z)]
  state, y = jax.lax.scan(step, state,
                          (*xs, reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(y, 0, 1), (state if output_final_state else None)
