"""The token-by-token form: ``comba_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.comba.inputs import default_scale, validate
from lin_attn_jax.ops.comba.step import comba_step
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.delta_rule.inputs import l2_normalize

_F32 = jnp.float32


def recurrent_comba(q, k, v, p, g, beta, *, scale=None, initial_state=None,
                    output_final_state=False, segment_ids=None,
                    use_qk_l2norm=False):
  """``comba_step`` scanned over time. Shapes as in ``chunk_comba``."""
  bs, t, _, hv, dk, dv, _ = validate(q, k, v, p, g, beta, initial_state,
                                     segment_ids)
  scale = default_scale(scale, dk)
  # Normalised once here rather than in every step.
  if use_qk_l2norm:
    q, k, p = l2_normalize(q), l2_normalize(k), l2_normalize(p)
  reset = reset_flags(segment_ids, bs, t)
  state = (jnp.zeros((bs, hv, dk, dv), _F32) if initial_state is None
           else jnp.asarray(initial_state, _F32))

  def step(state, inputs):
    q_t, k_t, v_t, p_t, g_t, beta_t, reset_t = inputs
    o_t, state = comba_step(q_t, k_t, v_t, p_t, g_t, beta_t, state,
                            scale=scale, reset=reset_t)
    return state, o_t

  xs = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, p, g, beta)]
  state, o = jax.lax.scan(step, state, (*xs, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
