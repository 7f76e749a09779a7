"""The token-by-token form: ``rwkv6_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.rwkv6.inputs import default_scale, validate
from lin_attn_jax.ops.rwkv6.step import rwkv6_step

_F32 = jnp.float32


def recurrent_rwkv6(r, k, v, w, u, *, scale=None, initial_state=None,
                    output_final_state=False, segment_ids=None):
  """``rwkv6_step`` scanned over time. Shapes as in ``chunk_rwkv6``."""
  b, t, h, dk, dv = validate(r, k, v, w, u, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  reset = reset_flags(segment_ids, b, t)
  state = (jnp.zeros((b, h, dk, dv), _F32) if initial_state is None
           else jnp.asarray(initial_state, _F32))
  # float32 before the scan, so that u's gradient sums over time in float32.
  u = jnp.asarray(u, _F32)

  def step(state, inputs):
    r_t, k_t, v_t, w_t, reset_t = inputs
    o_t, state = rwkv6_step(r_t, k_t, v_t, w_t, u, state, scale=scale,
                            reset=reset_t)
    return state, o_t

  xs = [jnp.moveaxis(x, 1, 0) for x in (r, k, v, w)]
  state, o = jax.lax.scan(step, state, (*xs, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
