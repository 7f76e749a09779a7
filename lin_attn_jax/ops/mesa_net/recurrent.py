"""The token-by-token form: ``mesa_net_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.mesa_net.inputs import CG_STEPS, validate, zero_state
from lin_attn_jax.ops.mesa_net.step import mesa_net_step

_F32 = jnp.float32


def recurrent_mesa_net(q, k, v, g, beta, lamb, *, initial_state=None,
                       output_final_state=False, segment_ids=None,
                       cg_steps=CG_STEPS, use_qk_l2norm=False):
  """``mesa_net_step`` scanned over time; arguments and result as in
  ``naive_recurrent_mesa_net``. The scan keeps every token's state ``[K, K
  + V]`` for the backward pass."""
  b, t, h, dk, dv = validate(q, k, v, g, beta, lamb, initial_state,
                             segment_ids, cg_steps)
  reset = reset_flags(segment_ids, b, t)
  state = (zero_state(b, h, dk, dv) if initial_state is None
           else jnp.asarray(initial_state, _F32))
  lamb = jnp.asarray(lamb, _F32)

  def step(state, inputs):
    q_t, k_t, v_t, g_t, beta_t, reset_t = inputs
    o_t, state = mesa_net_step(q_t, k_t, v_t, g_t, beta_t, lamb, state,
                               reset=reset_t, cg_steps=cg_steps,
                               use_qk_l2norm=use_qk_l2norm)
    return state, o_t

  xs = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta)]
  state, o = jax.lax.scan(step, state, (*xs, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
