"""The definition of Mamba-2's SSD, one token at a time.

    dt_t = softplus(dt_t + dt_bias)                (bias, softplus optional)
    h_t  = exp(dt_t A) h_{t-1} + B_t (dt_t x_t)^T     h: [N, P] per head
    y_t  = h_t^T C_t + D x_t

with head ``h`` reading the ``B_t, C_t`` of group ``h // (H / G)``. At a
document boundary ``h_{t-1}`` is replaced by 0. Float32, written for reading.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.gated_linear import naive_recurrent_gated_linear
from lin_attn_jax.ops.ssd.bidirectional import noncausal_ssd
from lin_attn_jax.ops.ssd.inputs import add_skip, time_step, validate

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_ssd(x, dt, A, B, C, *, D=None, dt_bias=None,
                        dt_softplus=False, initial_state=None,
                        output_final_state=False, segment_ids=None,
                        causal=True):
  """Reference recurrence. Shapes as in ``chunk_ssd``."""
  batch, length, n_heads, head_dim, groups, n_state = validate(
      x, dt, A, B, C, D, dt_bias, dt_softplus, initial_state, segment_ids)
  check_no_state("naive_recurrent_ssd", causal, initial_state,
                 output_final_state)
  if not causal:
    return noncausal_ssd(naive_recurrent_gated_linear, x, dt, A, B, C, D=D,
                         dt_bias=dt_bias, dt_softplus=dt_softplus,
                         segment_ids=segment_ids)
  per_group = n_heads // groups
  step_size = time_step(dt, dt_bias, dt_softplus)                # [B, T, H]
  b_heads = jnp.repeat(jnp.asarray(B, jnp.float32), per_group, axis=2)
  c_heads = jnp.repeat(jnp.asarray(C, jnp.float32), per_group, axis=2)
  A = jnp.asarray(A, jnp.float32)
  reset = reset_flags(segment_ids, batch, length)

  def step(h, inputs):
    x_t, dt_t, b_t, c_t, reset_t = inputs   # [B,H,P], [B,H], [B,H,N], [B]
    h = jnp.where(reset_t[:, None, None, None], 0.0, h)
    h = (jnp.exp(dt_t * A)[..., None, None] * h
         + b_t[..., :, None] * (dt_t[..., None] * x_t)[..., None, :])
    y_t = jnp.einsum("bhnp,bhn->bhp", h, c_t, precision=_HIGHEST)
    return h, y_t

  state = initial(initial_state, (batch, n_heads, n_state, head_dim))
  xs = [jnp.moveaxis(v, 1, 0) for v in
        (jnp.asarray(x, jnp.float32), step_size, b_heads, c_heads)]
  state, y = jax.lax.scan(step, state, (*xs, reset.T))
  y = add_skip(jnp.moveaxis(y, 0, 1), x, D)
  return y.astype(x.dtype), (state if output_final_state else None)
