"""One RWKV-6 decoding step, O(1) in the context length."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.rwkv6.inputs import default_scale, validate_step

_F32 = jnp.float32


def rwkv6_step(r, k, v, w, u, state=None, *, scale=None, reset=None):
  """One decoding step, O(1) in the context length.

  Args:
    r, k: ``[B, H, K]``; v: ``[B, H, V]``; w: ``[B, H, K]`` log-decay;
    u: ``[H, K]`` bonus.
    state: ``[B, H, K, V]`` float32, or None for zeros.
    scale: receptance scale, ``K ** -0.5`` when None (RWKV models use 1.0).
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(o [B, H, V] in v's dtype, new state [B, H, K, V] float32)``.
  """
  b, h, dk, dv = validate_step(r, k, v, w, u, state, reset)
  scale = default_scale(scale, dk)
  out_dtype = v.dtype
  r, k, v, w, u = (jnp.asarray(x, _F32) for x in (r, k, v, w, u))
  state = (jnp.zeros((b, h, dk, dv), _F32) if state is None
           else jnp.asarray(state, _F32))
  if reset is not None:
    state = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, state)
  kv = k[..., :, None] * v[..., None, :]                        # [B, H, K, V]
  read = state + u[..., None] * kv
  o = jnp.einsum("bhk,bhkv->bhv", scale * r, read)
  state = jnp.exp(w)[..., None] * state + kv
  return o.astype(out_dtype), state
