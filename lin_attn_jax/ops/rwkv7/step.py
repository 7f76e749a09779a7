"""One RWKV-7 decoding step, O(1) in the context length."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.rwkv7.inputs import default_scale, validate_step

_F32 = jnp.float32


def rwkv7_step(r, w, k, v, a, b, state=None, *, scale=None, reset=None):
  """One decoding step, O(1) in the context length.

  Args:
    r, w, k, a, b: ``[B, H, K]`` (w a log-decay); v: ``[B, H, V]``.
    state: ``[B, H, K, V]`` float32, or None for zeros.
    scale: receptance scale, ``K ** -0.5`` when None (RWKV models use 1.0).
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(o [B, H, V] in v's dtype, new state [B, H, K, V] float32)``.
  """
  bs, h, dk, dv = validate_step(r, w, k, v, a, b, state, reset)
  scale = default_scale(scale, dk)
  r, w, k, a, b = (jnp.asarray(x, _F32) for x in (r, w, k, a, b))
  state = (jnp.zeros((bs, h, dk, dv), _F32) if state is None
           else jnp.asarray(state, _F32))
  if reset is not None:
    state = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, state)
  read = jnp.einsum("bhk,bhkv->bhv", a, state)                  # [B, H, V]
  state = (jnp.exp(w)[..., None] * state
           + b[..., :, None] * read[..., None, :]
           + k[..., :, None] * jnp.asarray(v, _F32)[..., None, :])
  o = jnp.einsum("bhk,bhkv->bhv", scale * r, state)
  return o.astype(v.dtype), state
