"""The token-by-token form: ``ssd_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.gated_linear import recurrent_gated_linear
from lin_attn_jax.ops.ssd.bidirectional import noncausal_ssd
from lin_attn_jax.ops.ssd.inputs import validate
from lin_attn_jax.ops.ssd.step import ssd_step


def recurrent_ssd(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=False,
                  initial_state=None, output_final_state=False,
                  segment_ids=None, causal=True):
  """``ssd_step`` scanned over time. Shapes as in ``chunk_ssd``."""
  batch, length, n_heads, head_dim, _, n_state = validate(
      x, dt, A, B, C, D, dt_bias, dt_softplus, initial_state, segment_ids)
  check_no_state("recurrent_ssd", causal, initial_state,
                 output_final_state)
  if not causal:
    return noncausal_ssd(recurrent_gated_linear, x, dt, A, B, C, D=D,
                         dt_bias=dt_bias, dt_softplus=dt_softplus,
                         segment_ids=segment_ids)
  state = initial(initial_state, (batch, n_heads, n_state, head_dim))
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  A, D, dt_bias = (None if p is None else jnp.asarray(p, jnp.float32)
                   for p in (A, D, dt_bias))

  def step(h, inputs):
    x_t, dt_t, b_t, c_t, reset_t = inputs
    y_t, h = ssd_step(x_t, dt_t, A, b_t, c_t, h, D=D, dt_bias=dt_bias,
                      dt_softplus=dt_softplus, reset=reset_t)
    return h, y_t

  xs = [jnp.moveaxis(v, 1, 0) for v in (x, dt, B, C)]
  state, y = jax.lax.scan(step, state,
                          (*xs, reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(y, 0, 1), (state if output_final_state else None)
