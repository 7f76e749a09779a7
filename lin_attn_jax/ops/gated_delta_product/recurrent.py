"""The token-by-token form: ``gated_delta_product_step`` scanned over
time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.delta_rule.inputs import l2_normalize
from lin_attn_jax.ops.gated_delta_product.inputs import validate
from lin_attn_jax.ops.gated_delta_product.step import gated_delta_product_step


def recurrent_gated_delta_product(q, k, v, g, beta, *, scale=None,
                                  initial_state=None,
                                  output_final_state=False, segment_ids=None,
                                  use_qk_l2norm=False):
  """``gated_delta_product_step`` scanned over the ``T`` tokens (``N`` core
  steps each). Arguments and result as in
  ``naive_recurrent_gated_delta_product``."""
  (b, t), _, _, hv, dk, dv = validate(q, k, v, g, beta, initial_state,
                                      segment_ids)
  # Normalised once here rather than in every step.
  if use_qk_l2norm:
    q, k = l2_normalize(q), l2_normalize(k)
  reset = reset_flags(segment_ids, b, t)
  state = (jnp.zeros((b, hv, dk, dv), jnp.float32) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  gate = None if g is None else jnp.asarray(g, jnp.float32)

  def token(state, inputs):
    q_t, k_t, v_t, g_t, beta_t, reset_t = inputs
    o_t, state = gated_delta_product_step(q_t, k_t, v_t, g_t, beta_t, state,
                                          scale=scale, reset=reset_t)
    return state, o_t

  xs = [None if x is None else jnp.moveaxis(jnp.asarray(x), 1, 0)
        for x in (q, k, v, gate, beta)]
  state, o = jax.lax.scan(token, state, (*xs, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
