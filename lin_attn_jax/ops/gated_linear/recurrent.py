"""The token-by-token form: ``gated_linear_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.gated_linear.bidirectional import lion_outputs
from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate
from lin_attn_jax.ops.gated_linear.step import gated_linear_step


def recurrent_gated_linear(q, k, v, g=None, *, scale=None, initial_state=None,
                           output_final_state=False, segment_ids=None,
                           causal=True):
  """``gated_linear_step`` scanned over time. Shapes as in the chunk form;
  with ``causal=False`` scanned forward and backward (``bidirectional.py``).
  """
  b, t, h, dk, dv, g_checked = validate(q, k, v, g, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  check_no_state("recurrent_gated_linear", causal, initial_state,
                 output_final_state)
  if not causal:
    return lion_outputs(recurrent_gated_linear, q, k, v, g, scale=scale,
                        segment_ids=segment_ids).astype(v.dtype), None
  reset = reset_flags(segment_ids, b, t)
  state = (jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  gate = None if g_checked is None else jnp.asarray(g, jnp.float32)

  def step(state, inputs):
    q_t, k_t, v_t, g_t, reset_t = inputs
    o_t, state = gated_linear_step(q_t, k_t, v_t, g_t, state, scale=scale,
                                   reset=reset_t)
    return state, o_t

  xs = [None if x is None else jnp.moveaxis(x, 1, 0) for x in (q, k, v, gate)]
  state, o = jax.lax.scan(step, state, (*xs, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
