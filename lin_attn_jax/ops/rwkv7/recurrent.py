"""The token-by-token form: ``rwkv7_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.rwkv7.inputs import default_scale, validate
from lin_attn_jax.ops.rwkv7.step import rwkv7_step

_F32 = jnp.float32


def recurrent_rwkv7(r, w, k, v, a, b, *, scale=None, initial_state=None,
                    output_final_state=False, segment_ids=None):
  """``rwkv7_step`` scanned over time. Shapes as in ``chunk_rwkv7``."""
  bs, t, h, dk, dv = validate(r, w, k, v, a, b, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  reset = reset_flags(segment_ids, bs, t)
  state = (jnp.zeros((bs, h, dk, dv), _F32) if initial_state is None
           else jnp.asarray(initial_state, _F32))

  def step(state, inputs):
    r_t, w_t, k_t, v_t, a_t, b_t, reset_t = inputs
    o_t, state = rwkv7_step(r_t, w_t, k_t, v_t, a_t, b_t, state, scale=scale,
                            reset=reset_t)
    return state, o_t

  xs = [jnp.moveaxis(x, 1, 0) for x in (r, w, k, v, a, b)]
  state, o = jax.lax.scan(step, state, (*xs, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
