"""Argument checks of the Mamba-3 op, its state, and the per-token
quantities every form shares.

The state is one float32 array ``[B, H, K + 1, V + 1]``:

    [:K, :V]  S^_t = R(phi_t)^T S_t, the SSM state in the frame of the last
              token's rotation (``README.md``)
    [:K, V]   k_t, the last key, not rotated (in that same frame)
    [K, :V]   v_t, the last value
    [K, V]    0

``pack_mamba3_state`` and ``unpack_mamba3_state`` convert from and to the
three arrays; ``from_reference_state`` and ``to_reference_state`` from and
to the reference's ``(Angle_State, SSM_State, K_State, V_State)``, whose
``S`` and ``K`` are rotated by the cumulative angle ``phi``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks

_F32 = jnp.float32
TWO_PI = 2.0 * math.pi


def _check_gate(name, x, lead, layout):
  checks.check_float(name, x)
  checks.check_shape(name, x, lead, layout)


def _check_angles(angles, lead, dk, layout):
  checks.check_float("angles", angles)
  checks.check_rank("angles", angles, len(lead) + 1, layout)
  n_angles = checks.shape_of(angles)[-1]
  if checks.shape_of(angles)[:-1] != tuple(lead) or not (
      1 <= n_angles <= dk // 2):
    raise ValueError(f"angles must have shape {tuple(lead)} + (A,) "
                     f"({layout}) with 1 <= A <= K / 2 = {dk // 2}, got "
                     f"{checks.shape_of(angles)}")
  return n_angles


def state_shape(b, h, dk, dv):
  return (b, h, dk + 1, dv + 1)


def validate(q, k, v, g, dt, trap, angles, initial_state, segment_ids):
  """Checks a sequence call; returns ``(B, T, H, K, V, A)``."""
  b, t, h, dk, dv = checks.check_qkv(q, k, v)
  for name, x in (("g", g), ("dt", dt), ("trap", trap)):
    _check_gate(name, x, (b, t, h), "[B, T, H]")
  n_angles = _check_angles(angles, (b, t, h), dk, "[B, T, H, A]")
  checks.check_nonpositive("g", g)
  checks.check_state("initial_state", initial_state,
                     state_shape(b, h, dk, dv), "[B, H, K + 1, V + 1]")
  checks.check_segment_ids(segment_ids, b, t)
  return b, t, h, dk, dv, n_angles


def validate_step(q, k, v, g, dt, trap, angles, state, reset):
  """Checks a decoding step; returns ``(B, H, K, V, A)``."""
  b, h, dk, dv = checks.check_qkv_step(q, k, v)
  for name, x in (("g", g), ("dt", dt), ("trap", trap)):
    _check_gate(name, x, (b, h), "[B, H]")
  n_angles = _check_angles(angles, (b, h), dk, "[B, H, A]")
  checks.check_nonpositive("g", g)
  checks.check_state("state", state, state_shape(b, h, dk, dv),
                     "[B, H, K + 1, V + 1]")
  checks.check_reset(reset, b)
  return b, h, dk, dv, n_angles


def pack_mamba3_state(ssm, k_last, v_last):
  """``(S^ [B, H, K, V], k_t [B, H, K], v_t [B, H, V])`` -> the float32
  state ``[B, H, K + 1, V + 1]``."""
  ssm = jnp.asarray(ssm, _F32)
  top = jnp.concatenate([ssm, jnp.asarray(k_last, _F32)[..., None]],
                        axis=-1)                        # [B, H, K, V + 1]
  bottom = jnp.concatenate([jnp.asarray(v_last, _F32),
                            jnp.zeros(ssm.shape[:2] + (1,), _F32)], axis=-1)
  return jnp.concatenate([top, bottom[:, :, None]], axis=2)


def unpack_mamba3_state(state):
  """The state ``[B, H, K + 1, V + 1]`` -> ``(S^ [B, H, K, V], k_t [B, H,
  K], v_t [B, H, V])``, float32."""
  state = jnp.asarray(state, _F32)
  return state[..., :-1, :-1], state[..., :-1, -1], state[..., -1, :-1]


def rotate_rows(s, phi):
  """``R(phi) S`` for ``S [..., K, V]`` and ``phi [..., A]``."""
  return jnp.swapaxes(rotate(jnp.swapaxes(s, -1, -2), phi[..., None, :]),
                      -1, -2)


def from_reference_state(angle, ssm, k_last, v_last):
  """The reference's state (``Angle_State [B, H, A]``, ``SSM_State [B, H,
  V, K]``, ``K_State [B, H, K]``, ``V_State [B, H, V]``) -> ours."""
  angle = jnp.asarray(angle, _F32)
  return pack_mamba3_state(
      rotate_rows(jnp.swapaxes(jnp.asarray(ssm, _F32), -1, -2), -angle),
      rotate(k_last, -angle), v_last)


def to_reference_state(state, angle):
  """Ours, with the cumulative angles ``phi [B, H, A]`` that the reference
  carries -> ``(SSM_State [B, H, V, K], K_State [B, H, K], V_State [B, H,
  V])``."""
  ssm, k_last, v_last = unpack_mamba3_state(state)
  angle = jnp.asarray(angle, _F32)
  return (jnp.swapaxes(rotate_rows(ssm, angle), -1, -2),
          rotate(k_last, angle), v_last)


def zero_state(b, h, dk, dv):
  return jnp.zeros(state_shape(b, h, dk, dv), _F32)


def angle_steps(angles, dt):
  """The rotation of each token, ``tanh(angles) * pi * dt`` (``[..., A]``,
  float32), as the reference's kernels compute it."""
  return (jnp.tanh(jnp.asarray(angles, _F32)) * math.pi
          * jnp.asarray(dt, _F32)[..., None])


def wrap(phi):
  """``phi`` modulo 2 pi, in [0, 2 pi) (the gradient passes as through the
  identity)."""
  return phi - TWO_PI * jax.lax.stop_gradient(jnp.floor(phi / TWO_PI))


def rotate(x, phi):
  """Rotates the pairs ``(x[2i], x[2i+1])`` of ``x [..., K]`` by ``phi[i]``
  for ``i < A`` (``phi [..., A]``); the other entries pass unchanged."""
  x = jnp.asarray(x, _F32)
  n_angles = phi.shape[-1]
  pairs = x[..., :2 * n_angles].reshape(x.shape[:-1] + (n_angles, 2))
  cos, sin = jnp.cos(phi), jnp.sin(phi)
  even, odd = pairs[..., 0], pairs[..., 1]
  rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos],
                      axis=-1).reshape(x.shape[:-1] + (2 * n_angles,))
  return jnp.concatenate([rotated, x[..., 2 * n_angles:]], axis=-1)


def trapezoid(dt, trap):
  """``(gamma, beta')``: the weights of the current and the previous
  token's write, ``lambda dt`` and ``(1 - lambda) dt`` with ``lambda =
  sigmoid(trap)`` (the previous token's write also decays by this token's
  ``exp(g)``), float32."""
  dt = jnp.asarray(dt, _F32)
  lam = jax.nn.sigmoid(jnp.asarray(trap, _F32))
  return lam * dt, (1.0 - lam) * dt
