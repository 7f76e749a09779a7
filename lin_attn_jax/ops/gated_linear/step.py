"""One decoding step of the gated-linear core, O(1) in the context length."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate_step


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
