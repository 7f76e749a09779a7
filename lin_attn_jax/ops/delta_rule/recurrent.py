"""The token-by-token form: ``delta_rule_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.delta_rule.inputs import (default_scale, l2_normalize,
                                                validate)
from lin_attn_jax.ops.delta_rule.step import delta_rule_step

_F32 = jnp.float32


def recurrent_delta_rule(q, k, v, beta, g=None, *, scale=None,
                         initial_state=None, output_final_state=False,
                         segment_ids=None, use_qk_l2norm=False):
  """``delta_rule_step`` scanned over time. Shapes as in the chunk form."""
  b, t, h, hv, dk, dv, g_checked = validate(q, k, v, beta, g, initial_state,
                                            segment_ids)
  scale = default_scale(scale, dk)
  # Normalised once here rather than in every step.
  if use_qk_l2norm:
    q, k = l2_normalize(q), l2_normalize(k)
  reset = reset_flags(segment_ids, b, t)
  state = (jnp.zeros((b, hv, dk, dv), _F32) if initial_state is None
           else jnp.asarray(initial_state, _F32))
  gate = None if g_checked is None else jnp.asarray(g, _F32)

  def step(state, inputs):
    q_t, k_t, v_t, beta_t, g_t, reset_t = inputs
    o_t, state = delta_rule_step(q_t, k_t, v_t, beta_t, g_t, state,
                                 scale=scale, reset=reset_t)
    return state, o_t

  xs = [None if x is None else jnp.moveaxis(x, 1, 0)
        for x in (q, k, v, beta, gate)]
  state, o = jax.lax.scan(step, state, (*xs, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
