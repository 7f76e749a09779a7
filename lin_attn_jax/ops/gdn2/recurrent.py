"""The token-by-token form: ``gdn2_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.delta_rule.inputs import l2_normalize
from lin_attn_jax.ops.gdn2.inputs import default_scale, validate
from lin_attn_jax.ops.gdn2.step import gdn2_step

_F32 = jnp.float32


def recurrent_gdn2(q, k, v, g, b, w, *, scale=None, initial_state=None,
                   output_final_state=False, segment_ids=None,
                   use_qk_l2norm=False):
  """``gdn2_step`` scanned over time. Shapes as in ``chunk_gdn2``."""
  bs, t, _, hv, dk, dv = validate(q, k, v, g, b, w, initial_state,
                                  segment_ids)
  scale = default_scale(scale, dk)
  # Normalised once here rather than in every step.
  if use_qk_l2norm:
    q, k = l2_normalize(q), l2_normalize(k)
  reset = reset_flags(segment_ids, bs, t)
  state = (jnp.zeros((bs, hv, dk, dv), _F32) if initial_state is None
           else jnp.asarray(initial_state, _F32))

  def step(state, inputs):
    q_t, k_t, v_t, g_t, b_t, w_t, reset_t = inputs
    o_t, state = gdn2_step(q_t, k_t, v_t, g_t, b_t, w_t, state, scale=scale,
                           reset=reset_t)
    return state, o_t

  xs = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, b, w)]
  state, o = jax.lax.scan(step, state, (*xs, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
