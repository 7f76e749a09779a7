"""Token-by-token forms: one decoding step and its ``lax.scan``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.gated_linear.inputs import (default_scale, validate,
                                                  validate_step)


def gated_linear_step(q, k, v, g=None, state=None, *, scale=None, reset=None):
  """One decoding step, O(1) in the context length.

  Args:
    q, k: ``[B, H, K]``; v: ``[B, H, V]``.
    g: log-decay ``[B, H]`` or ``[B, H, K]``, or None.
    state: ``[B, H, K, V]`` float32, or None for zeros.
    scale: query scale, ``K ** -0.5`` when None.
    reset: ``[B]`` bool, True where this token starts a new document (the
      state is zeroed before the update).
  Returns:
    ``(o [B, H, V] in v's dtype, new state [B, H, K, V] float32)``.
  """
  b, h, dk, dv, g = validate_step(q, k, v, g, state, reset)
  scale = default_scale(scale, dk)
  state = (jnp.zeros((b, h, dk, dv), jnp.float32) if state is None
           else jnp.asarray(state, jnp.float32))
  if reset is not None:
    state = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, state)
  if g is not None:
    # [B, H, K, V]; as a dot_general, whose gradient XLA:CPU runs faster
    # than that of a broadcast multiply.
    state = jnp.einsum("bhk,bhkv->bhkv", jnp.exp(g), state,
                       preferred_element_type=jnp.float32)
  state = state + jnp.einsum("bhk,bhv->bhkv", k, v,
                             preferred_element_type=jnp.float32)
  o = jnp.einsum("bhk,bhkv->bhv", (scale * q).astype(jnp.float32), state)
  return o.astype(v.dtype), state


def recurrent_gated_linear(q, k, v, g=None, *, scale=None, initial_state=None,
                           output_final_state=False, segment_ids=None):
  """``gated_linear_step`` scanned over time. Shapes as in the chunk form."""
  b, t, h, dk, dv, g_checked = validate(q, k, v, g, initial_state, segment_ids)
  scale = default_scale(scale, dk)
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
