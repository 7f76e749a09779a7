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
  _, _, hv, dk, _, g = validate_step(q, k, v, beta, g, state, reset)
  scale = default_scale(scale, dk)
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)              # [B, HV, K]
  beta = jnp.asarray(beta, _F32)[..., None]                     # [B, HV, 1]
  o, state = erase_write(scale * q, k, beta * k, beta * jnp.asarray(v, _F32),
                         g, state, reset)
  return o.astype(v.dtype), state


def erase_write(q, k, erase, written, g, state, reset,
                read_before_decay=False):
  """One step from the erase key and the written value, in float32.

  ``S' = diag(exp(g)) S``, ``S_new = S' + k (x - S'^T e)^T``, ``o = S_new^T
  q``: the delta rule with ``e = beta k`` and ``x = beta v``, Gated
  DeltaNet-2 with ``e = b * k`` and ``x = w * v``. With
  ``read_before_decay``, ``S_new = S' + k (x - S^T e)^T`` (Comba, ``e =
  beta p``, ``x = beta v``).

  Args:
    q (scaled), k, erase: ``[B, HV, K]``; written: ``[B, HV, V]``; g:
      ``[B, HV, G]`` or None; state: ``[B, HV, K, V]`` or None for zeros;
      reset: ``[B]`` bool or None.
  Returns:
    ``(o [B, HV, V], new state [B, HV, K, V])``, float32.
  """
  bs, hv, dk = k.shape
  state = (jnp.zeros((bs, hv, dk, written.shape[-1]), _F32) if state is None
           else jnp.asarray(state, _F32))
  if reset is not None:
    state = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, state)
  if read_before_decay:
    erased = jnp.einsum("bhk,bhkv->bhv", erase, state)          # [B, HV, V]
  if g is not None:
    state = jnp.exp(g)[..., None] * state                       # [B, HV, K, V]
  if not read_before_decay:
    erased = jnp.einsum("bhk,bhkv->bhv", erase, state)          # [B, HV, V]
  state = state + k[..., :, None] * (written - erased)[..., None, :]
  o = jnp.einsum("bhk,bhkv->bhv", q, state)                     # [B, HV, V]
  return o, state
