"""Token-by-token forms: one decoding step and its ``lax.scan``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.delta_rule.inputs import (default_scale,
                                                expand_query_key, l2_normalize,
                                                validate, validate_step)

_F32 = jnp.float32


def delta_rule_step(q, k, v, beta, g=None, state=None, *, scale=None,
                    reset=None, use_qk_l2norm=False):
  """One decoding step, O(1) in the context length.

  Args:
    q, k: ``[B, H, K]``; v: ``[B, HV, V]`` (``HV`` a multiple of ``H``).
    beta: ``[B, HV]`` writing strength (in (0, 2) for a stable state).
    g: log-decay ``[B, HV]`` or ``[B, HV, K]``, or None.
    state: ``[B, HV, K, V]`` float32, or None for zeros.
    scale: query scale, ``K ** -0.5`` when None.
    reset: ``[B]`` bool, True where this token starts a new document.
    use_qk_l2norm: L2-normalise q and k first.
  Returns:
    ``(o [B, HV, V] in v's dtype, new state [B, HV, K, V] float32)``.
  """
  b, h, hv, dk, dv, g = validate_step(q, k, v, beta, g, state, reset)
  scale = default_scale(scale, dk)
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)              # [B, HV, K]
  state = (jnp.zeros((b, hv, dk, dv), _F32) if state is None
           else jnp.asarray(state, _F32))
  if reset is not None:
    state = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, state)
  if g is not None:
    state = jnp.exp(g)[..., None] * state                       # [B, HV, K, V]
  predicted = jnp.einsum("bhk,bhkv->bhv", k, state)
  delta = jnp.asarray(beta, _F32)[..., None] * (jnp.asarray(v, _F32)
                                                - predicted)   # [B, HV, V]
  state = state + k[..., :, None] * delta[..., None, :]
  o = jnp.einsum("bhk,bhkv->bhv", scale * q, state)
  return o.astype(v.dtype), state


def recurrent_delta_rule(q, k, v, beta, g=None, *, scale=None,
                         initial_state=None, output_final_state=False,
                         segment_ids=None, use_qk_l2norm=False):
  """``delta_rule_step`` scanned over time. Shapes as in the chunk form."""
  b, t, h, hv, dk, dv, g_checked = validate(q, k, v, beta, g, initial_state,
                                            segment_ids)
  scale = default_scale(scale, dk)
  # Normalised once here rather than in every step.
  if use_qk_l2norm:
    q, k = l2_normalize(q), l2_normalize(k)
  reset = reset_flags(segment_ids, b, t)
  state = (jnp.zeros((b, hv, dk, dv), _F32) if initial_state is None
           else jnp.asarray(initial_state, _F32))
  gate = None if g_checked is None else jnp.asarray(g, _F32)

  def step(state, inputs):
    q_t, k_t, v_t, beta_t, g_t, reset_t = inputs
    o_t, state = delta_rule_step(q_t, k_t, v_t, beta_t, g_t, state,
                                 scale=scale, reset=reset_t)
    return state, o_t

  xs = [None if x is None else jnp.moveaxis(x, 1, 0)
        for x in (q, k, v, beta, gate)]
  state, o = jax.lax.scan(step, state, (*xs, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
