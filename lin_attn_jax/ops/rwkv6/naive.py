"""The definition of RWKV-6 (Finch), one token at a time.

    o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale * r_t)   S: [K, V] per head
    S_t = diag(exp(w_t)) S_{t-1} + k_t v_t^T

The output reads the state before the current token plus the current token
weighted by the bonus ``u``. ``w`` is a natural-log decay per key channel
(RWKV-6 computes it as ``-exp(.)``). At a document boundary ``S_{t-1}`` is
replaced by 0. RWKV models use ``scale=1.0``; ``None`` means ``K ** -0.5`` as
everywhere in this package.

Peng et al., "Eagle and Finch: RWKV with Matrix-Valued States and Dynamic
Recurrence" (https://arxiv.org/abs/2404.05892).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.rwkv6.inputs import default_scale, validate

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_rwkv6(r, k, v, w, u, *, scale=None, initial_state=None,
                          output_final_state=False, segment_ids=None):
  """Reference recurrence. Shapes as in ``chunk_rwkv6``."""
  b, t, h, dk, dv = validate(r, k, v, w, u, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  bonus = jnp.asarray(u, jnp.float32)[..., None]               # [H, K, 1]
  state = (jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  reset = reset_flags(segment_ids, b, t)

  def step(state, inputs):
    r_t, k_t, v_t, w_t, reset_t = inputs                # [B, H, K], [B]
    state = jnp.where(reset_t[:, None, None, None], 0.0, state)
    kv = k_t[..., :, None] * v_t[..., None, :]               # [B, H, K, V]
    o_t = jnp.einsum("bhk,bhkv->bhv", scale * r_t, state + bonus * kv,
                     precision=_HIGHEST)
    state = jnp.exp(w_t)[..., None] * state + kv
    return state, o_t

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0)
                for x in (r, k, v, w)]
  state, o = jax.lax.scan(step, state, (*time_major, reset.T))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)                 # [B, T, H, V]
  return o, (state if output_final_state else None)
