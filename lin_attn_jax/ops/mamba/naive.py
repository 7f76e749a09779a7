"""The definition of Mamba's selective scan (S6), one token at a time.

    dt_t = softplus(delta_t + delta_bias)      (bias and softplus optional)
    h_t  = exp(dt_t A) * h_{t-1} + (dt_t u_t) B_t     h: [D, N] per batch row
    y_t  = (h_t C_t + D u_t) * silu(z_t)              (D and z optional)

with channel ``d`` reading the ``B_t, C_t`` of its group. At a document
boundary ``h_{t-1}`` is replaced by 0. Float32, written for reading.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.mamba.bidirectional import noncausal_selective_scan
from lin_attn_jax.ops.mamba.inputs import (finish, grouped_projection,
                                           time_step, validate)

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_selective_scan(u, delta, A, B, C, *, D=None, z=None,
                                   delta_bias=None, delta_softplus=False,
                                   initial_state=None, output_final_state=False,
                                   segment_ids=None, causal=True):
  """Reference recurrence. Shapes as in ``chunk_selective_scan``."""
  dims = validate(u, delta, A, B, C, D, z, delta_bias, initial_state,
                  segment_ids)
  check_no_state("naive_recurrent_selective_scan", causal, initial_state,
                 output_final_state)
  if not causal:
    return noncausal_selective_scan(
        None, u, delta, A, B, C, D=D, z=z,
        delta_bias=delta_bias, delta_softplus=delta_softplus,
        segment_ids=segment_ids, dims=dims)
  length = u.shape[1]
  per_group = dims.width // dims.groups
  dt = time_step(delta, delta_bias, delta_softplus)              # [B, T, D]
  # Every channel's own copy of its group's B and C: [B, T, D, N].
  b_proj = jnp.repeat(grouped_projection(B, 2), per_group, axis=2)
  c_proj = jnp.repeat(grouped_projection(C, 2), per_group, axis=2)
  A = jnp.asarray(A, jnp.float32)
  reset = reset_flags(segment_ids, dims.batch, length)

  def step(h, inputs):
    u_t, dt_t, b_t, c_t, reset_t = inputs          # [B, D], [B, D, N], [B]
    h = jnp.where(reset_t[:, None, None], 0.0, h)
    h = jnp.exp(dt_t[..., None] * A) * h + (dt_t * u_t)[..., None] * b_t
    y_t = jnp.einsum("bdn,bdn->bd", h, c_t, precision=_HIGHEST)
    return h, y_t

  state = initial(initial_state, (dims.batch, dims.width, dims.state))
  xs = [jnp.moveaxis(x, 1, 0)
        for x in (jnp.asarray(u, jnp.float32), dt, b_proj, c_proj)]
  state, y = jax.lax.scan(step, state, (*xs, reset.T))
  y = finish(jnp.moveaxis(y, 0, 1), u, D, z)
  return y.astype(u.dtype), (state if output_final_state else None)
