"""Argument checks of the mLSTM op, and its state: ``(C, n, m)`` packed
into one float32 array ``[B, H, K, V + 2]``.

Columns ``:V`` hold the memory ``C [K, V]``, column ``V`` the normaliser
``n [K]`` and column ``V + 1`` the max state ``m`` (one scalar per head,
repeated on every row; the forms read row 0). ``pack_mlstm_state`` and
``unpack_mlstm_state`` convert from and to the reference's triple ``(C [B,
H, K, V], n [B, H, K], m [B, H, 1])``.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks

EPS = 1e-6
# The extra state columns: the normaliser n and the max state m.
STATE_EXTRA = 2


def default_scale(scale, dk: int) -> float:
  return dk ** -0.5 if scale is None else scale


def _check_gate(name, x, lead, layout):
  checks.check_float(name, x)
  checks.check_shape(name, x, lead, layout)


def validate(q, k, v, i, f, initial_state, segment_ids):
  """Checks a sequence call; returns ``(B, T, H, K, V)``."""
  b, t, h, dk, dv = checks.check_qkv(q, k, v)
  _check_gate("i", i, (b, t, h), "[B, T, H]")
  _check_gate("f", f, (b, t, h), "[B, T, H]")
  checks.check_state("initial_state", initial_state,
                     (b, h, dk, dv + STATE_EXTRA), "[B, H, K, V + 2]")
  checks.check_segment_ids(segment_ids, b, t)
  return b, t, h, dk, dv


def validate_step(q, k, v, i, f, state, reset):
  """Checks a decoding step; returns ``(B, H, K, V)``."""
  b, h, dk, dv = checks.check_qkv_step(q, k, v)
  _check_gate("i", i, (b, h), "[B, H]")
  _check_gate("f", f, (b, h), "[B, H]")
  checks.check_state("state", state, (b, h, dk, dv + STATE_EXTRA),
                     "[B, H, K, V + 2]")
  checks.check_reset(reset, b)
  return b, h, dk, dv


def pack_mlstm_state(c, n, m):
  """``(C [B, H, K, V], n [B, H, K], m [B, H] or [B, H, 1])`` -> the
  float32 state ``[B, H, K, V + 2]``."""
  c = jnp.asarray(c, jnp.float32)
  m = jnp.asarray(m, jnp.float32).reshape(c.shape[:2])
  return jnp.concatenate(
      [c, jnp.asarray(n, jnp.float32)[..., None],
       jnp.broadcast_to(m[..., None, None], c.shape[:3] + (1,))], axis=-1)


def unpack_mlstm_state(state):
  """The state ``[B, H, K, V + 2]`` -> ``(C [B, H, K, V], n [B, H, K],
  m [B, H])``, float32."""
  state = jnp.asarray(state, jnp.float32)
  return state[..., :-2], state[..., -2], state[..., 0, -1]


def zero_state(b, h, dk, dv):
  return jnp.zeros((b, h, dk, dv + STATE_EXTRA), jnp.float32)
