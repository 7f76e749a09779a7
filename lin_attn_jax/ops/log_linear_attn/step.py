"""One decoding step, O(L) states: O(log T) in the context length."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.log_linear_attn.inputs import (default_scale,
                                                    merge_level,
                                                    validate_step)

_F32 = jnp.float32


def log_linear_attn_step(q, k, v, g, level_scales, state=None, *, offset=0,
                         scale=None, reset=None):
  """One decoding step on the Fenwick level states.

  Args:
    q, k: ``[B, H, K]``; v: ``[B, H, V]``; g: ``[B, H]`` log-decay ``<= 0``;
    level_scales: ``[B, H, L]``.
    state: ``[B, H, L, K, V]`` float32, or None for zeros.
    offset: int or ``[B]`` int, this token's position in its document (0
      where ``reset``, whatever is given): it says which levels merge
      before the token enters (``inputs.merge_level``).
    scale: query scale, ``K ** -0.5`` when None.
    reset: ``[B]`` bool, True where this token starts a new document (the
      state is zeroed first).
  Returns:
    ``(o [B, H, V] in v's dtype, new state [B, H, L, K, V] float32)``.
  """
  b, h, dk, dv, levels = validate_step(q, k, v, g, level_scales, state,
                                       reset, offset)
  scale = default_scale(scale, dk)
  state = (jnp.zeros((b, h, levels, dk, dv), _F32) if state is None
           else jnp.asarray(state, _F32))
  position = jnp.broadcast_to(jnp.asarray(offset, jnp.int32), (b,))
  if reset is not None:
    reset = jnp.asarray(reset)
    state = jnp.where(reset[:, None, None, None, None], 0.0, state)
    position = jnp.where(reset, 0, position)
  m = merge_level(position, levels)                             # [B]
  level = jnp.arange(levels)
  into = (level[None] == m[:, None]).astype(_F32)               # [B, L]
  below = (level[None] <= m[:, None]).astype(_F32)              # [B, L]
  # Levels 0..m summed into m, the levels above kept; then the decay.
  merged = jnp.einsum("bl,bhlkv->bhkv", below, state,
                      preferred_element_type=_F32)
  state = (jnp.einsum("bl,bhlkv->bhlkv", 1.0 - below, state,
                      preferred_element_type=_F32)
           + into[:, None, :, None, None] * merged[:, :, None])
  state = jnp.einsum("bh,bhlkv->bhlkv", jnp.exp(jnp.asarray(g, _F32)), state,
                     preferred_element_type=_F32)
  state = state.at[:, :, 0].add(jnp.einsum(
      "bhk,bhv->bhkv", k, v, preferred_element_type=_F32))
  o = jnp.einsum("bhk,bhl,bhlkv->bhv", (scale * q).astype(_F32),
                 jnp.asarray(level_scales, _F32), state,
                 preferred_element_type=_F32)
  return o.astype(v.dtype), state
