"""The definition of the delta-rule core, one token at a time.

    S'_t = diag(exp(g_t)) S_{t-1}                       decay (g <= 0)
    S_t  = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T        delta rule
         = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
    o_t  = S_t^T (scale * q_t)                          S: [K, V] per head

``g`` is None (DeltaNet), a scalar per head (Gated DeltaNet) or one value
per key channel (KDA). At a document boundary ``S_{t-1}`` is replaced by 0.
Everything here is float32 and written for reading; every other form is
tested against it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.delta_rule.inputs import (default_scale,
                                                expand_query_key, validate)

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_delta_rule(q, k, v, beta, g=None, *, scale=None,
                               initial_state=None, output_final_state=False,
                               segment_ids=None, use_qk_l2norm=False):
  """Reference recurrence. Shapes as in ``chunk_delta_rule``."""
  b, t, h, hv, dk, dv, g = validate(q, k, v, beta, g, initial_state,
                                    segment_ids)
  scale = default_scale(scale, dk)
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)            # [B, T, HV, K]
  if g is None:
    g = jnp.zeros((b, t, hv, 1), jnp.float32)
  state = (jnp.zeros((b, hv, dk, dv), jnp.float32) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  reset = reset_flags(segment_ids, b, t)

  def step(state, inputs):
    q_t, k_t, v_t, beta_t, g_t, reset_t = inputs       # [B, HV, K], [B]
    state = jnp.where(reset_t[:, None, None, None], 0.0, state)
    state = jnp.exp(g_t)[..., None] * state                 # [B, HV, K, V]
    predicted = jnp.einsum("bhk,bhkv->bhv", k_t, state, precision=_HIGHEST)
    delta = beta_t[..., None] * (v_t - predicted)           # [B, HV, V]
    state = state + k_t[..., :, None] * delta[..., None, :]
    o_t = jnp.einsum("bhk,bhkv->bhv", scale * q_t, state, precision=_HIGHEST)
    return state, o_t

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0)
                for x in (q, k, v, beta, g)]
  state, o = jax.lax.scan(step, state, (*time_major, reset.T))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)                 # [B, T, HV, V]
  return o, (state if output_final_state else None)
