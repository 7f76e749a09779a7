"""One decoding step of the delta-rule core, O(1) in the context length."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.delta_rule.inputs import (default_scale, expand_query_key,
                                                validate_step)

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
