"""The reference recurrence of the RG-LRU."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.rg_lru.bidirectional import noncausal_rg_lru
from lin_attn_jax.ops.rg_lru.coefficients import sqrt_bounded_derivative
from lin_attn_jax.ops.rg_lru.inputs import validate

_F32 = jnp.float32


def naive_recurrent_rg_lru(x, a_gate, x_gate, a_param, *, c=8.0,
                           initial_state=None, output_final_state=False,
                           segment_ids=None, unscaled=None, causal=True):
  """Reference recurrence, the gates computed token by token."""
  batch, width = validate(x, a_gate, x_gate, a_param, initial_state,
                          segment_ids, step=False, unscaled=unscaled)
  check_no_state("naive_recurrent_rg_lru", causal, initial_state,
                 output_final_state)
  if not causal:
    return noncausal_rg_lru(None, x, a_gate, x_gate,
                            a_param, c=c, segment_ids=segment_ids,
                            unscaled=unscaled)
  softplus_param = jax.nn.softplus(jnp.asarray(a_param, _F32))
  reset = reset_flags(segment_ids, batch, x.shape[1])
  unscaled = (jnp.zeros_like(reset) if unscaled is None
              else jnp.asarray(unscaled, bool))

  def step(h, inputs):
    x_t, a_gate_t, x_gate_t, reset_t, unscaled_t = inputs
    h = jnp.where(reset_t[:, None], 0.0, h)
    log_a = -c * jax.nn.sigmoid(a_gate_t) * softplus_param
    a = jnp.exp(log_a)
    multiplier = sqrt_bounded_derivative(-jnp.expm1(2.0 * log_a))  # sqrt(1-a^2)
    multiplier = jnp.where(unscaled_t[:, None], 1.0, multiplier)
    h = a * h + multiplier * (jax.nn.sigmoid(x_gate_t) * x_t)
    return h, h

  xs = [jnp.moveaxis(jnp.asarray(v, _F32), 1, 0) for v in (x, a_gate, x_gate)]
  state, h = jax.lax.scan(step, initial(initial_state, (batch, width)),
                          (*xs, reset.T, unscaled.T))
  h = jnp.moveaxis(h, 0, 1).astype(x.dtype)
  return h, (state if output_final_state else None)
