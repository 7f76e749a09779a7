"""Argument checks of the MesaNet op, and its state: ``(H^kk, H^kv)``
packed into one float32 array ``[B, H, K, K + V]``.

Columns ``:K`` hold ``H^kk = sum_j beta_j k_j k_j^T`` (decayed) and
columns ``K:`` hold ``H^kv = sum_j beta_j k_j v_j^T``: both are the state of
the gated-linear core with the keys ``beta_t k_t``, the values ``[k_t |
v_t]`` and the scalar log-decay ``g_t``. ``pack_mesa_net_state`` and
``unpack_mesa_net_state`` convert from and to the reference's pair.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.delta_rule.inputs import l2_normalize

_F32 = jnp.float32
# Conjugate-gradient steps per solve: the reference's max_CG_iteration.
CG_STEPS = 30


def _check_per_token(name, x, lead, layout):
  checks.check_float(name, x)
  checks.check_shape(name, x, lead, layout)


def _check_lamb(lamb, h, dk):
  """``lamb [H, K]`` float. Its values are not checked: ``H^kk +
  diag(lamb)`` must be positive definite for the conjugate gradient, which
  ``lamb > 0`` ensures for any reachable ``H^kk``."""
  checks.check_float("lamb", lamb)
  checks.check_shape("lamb", lamb, (h, dk), "[H, K]")


def validate(q, k, v, g, beta, lamb, initial_state, segment_ids, cg_steps):
  """Checks a sequence call; returns ``(B, T, H, K, V)``."""
  b, t, h, dk, dv = checks.check_qkv(q, k, v)
  _check_per_token("g", g, (b, t, h), "[B, T, H]")
  checks.check_nonpositive("g", g)
  _check_per_token("beta", beta, (b, t, h), "[B, T, H]")
  _check_lamb(lamb, h, dk)
  checks.check_state("initial_state", initial_state, (b, h, dk, dk + dv),
                     "[B, H, K, K + V]")
  checks.check_segment_ids(segment_ids, b, t)
  checks.positive_int("cg_steps", cg_steps)
  return b, t, h, dk, dv


def validate_step(q, k, v, g, beta, lamb, state, reset, cg_steps):
  """Checks a decoding step; returns ``(B, H, K, V)``."""
  b, h, dk, dv = checks.check_qkv_step(q, k, v)
  _check_per_token("g", g, (b, h), "[B, H]")
  checks.check_nonpositive("g", g)
  _check_per_token("beta", beta, (b, h), "[B, H]")
  _check_lamb(lamb, h, dk)
  checks.check_state("state", state, (b, h, dk, dk + dv), "[B, H, K, K + V]")
  checks.check_reset(reset, b)
  checks.positive_int("cg_steps", cg_steps)
  return b, h, dk, dv


def query_key(q, k, use_qk_l2norm):
  """float32 ``(q, k)``, L2-normalised over the key channels if asked."""
  if use_qk_l2norm:
    return l2_normalize(q), l2_normalize(k)
  return jnp.asarray(q, _F32), jnp.asarray(k, _F32)


def pack_mesa_net_state(h_kk, h_kv):
  """``(H^kk [B, H, K, K], H^kv [B, H, K, V])`` -> the float32 state
  ``[B, H, K, K + V]``."""
  return jnp.concatenate([jnp.asarray(h_kk, _F32), jnp.asarray(h_kv, _F32)],
                         axis=-1)


def unpack_mesa_net_state(state):
  """The state ``[B, H, K, K + V]`` -> ``(H^kk [B, H, K, K], H^kv [B, H,
  K, V])``, float32."""
  state = jnp.asarray(state, _F32)
  dk = state.shape[-2]
  return state[..., :dk], state[..., dk:]


def zero_state(b, h, dk, dv):
  return jnp.zeros((b, h, dk, dk + dv), _F32)
