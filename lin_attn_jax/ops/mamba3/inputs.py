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


def _check_mimo_qkv(q, k, v, lead, layout_qk, layout_v):
  for name, x, layout in (("q", q, layout_qk), ("k", k, layout_qk),
                          ("v", v, layout_v)):
    checks.check_rank(name, x, len(lead) + 2, layout)
    checks.check_float(name, x)
  shape = checks.shape_of(q)
  if shape[:len(lead)] != tuple(lead):
    raise ValueError(f"q must have shape {tuple(lead)} + (R, K) "
                     f"({layout_qk}), got {shape}")
  if checks.shape_of(k) != shape:
    raise ValueError(f"k must have the shape of q {layout_qk} = {shape}, "
                     f"got {checks.shape_of(k)}")
  if checks.shape_of(v)[:-1] != shape[:-1]:
    raise ValueError(f"v ({layout_v}) must agree with q on all but its "
                     f"last axis, {shape[:-1]}, got {checks.shape_of(v)}")
  return shape[-2], shape[-1], checks.shape_of(v)[-1]


def mimo_state_shape(b, h, rank, dk, dv):
  return (b, h, dk + rank, dv + rank)


def validate_mimo(q, k, v, g, dt, trap, angles, initial_state, segment_ids):
  """Checks a MIMO sequence call; returns ``(B, T, H, R, K, V, A)``."""
  for name, x in (("q", q), ("v", v)):
    checks.check_rank(name, x, 5, "[B, T, H, R, K]" if name == "q"
                      else "[B, T, H, R, V]")
  b, t, h = checks.shape_of(q)[:3]
  rank, dk, dv = _check_mimo_qkv(q, k, v, (b, t, h), "[B, T, H, R, K]",
                                 "[B, T, H, R, V]")
  for name, x in (("g", g), ("dt", dt), ("trap", trap)):
    _check_gate(name, x, (b, t, h), "[B, T, H]")
  n_angles = _check_angles(angles, (b, t, h), dk, "[B, T, H, A]")
  checks.check_nonpositive("g", g)
  checks.check_state("initial_state", initial_state,
                     mimo_state_shape(b, h, rank, dk, dv),
                     "[B, H, K + R, V + R]")
  checks.check_segment_ids(segment_ids, b, t)
  return b, t, h, rank, dk, dv, n_angles


def validate_mimo_step(q, k, v, g, dt, trap, angles, state, reset):
  """Checks a MIMO decoding step; returns ``(B, H, R, K, V, A)``."""
  for name, x in (("q", q), ("v", v)):
    checks.check_rank(name, x, 4, "[B, H, R, K]" if name == "q"
                      else "[B, H, R, V]")
  b, h = checks.shape_of(q)[:2]
  rank, dk, dv = _check_mimo_qkv(q, k, v, (b, h), "[B, H, R, K]",
                                 "[B, H, R, V]")
  for name, x in (("g", g), ("dt", dt), ("trap", trap)):
    _check_gate(name, x, (b, h), "[B, H]")
  n_angles = _check_angles(angles, (b, h), dk, "[B, H, A]")
  checks.check_nonpositive("g", g)
  checks.check_state("state", state, mimo_state_shape(b, h, rank, dk, dv),
                     "[B, H, K + R, V + R]")
  checks.check_reset(reset, b)
  return b, h, rank, dk, dv, n_angles


def pack_mamba3_mimo_state(ssm, k_last, v_last):
  """``(S^ [B, H, K, V], k_{t, r} [B, H, R, K], v_{t, r} [B, H, R, V])``
  -> the float32 MIMO state ``[B, H, K + R, V + R]``: ``S^`` in ``[:K,
  :V]``, the last token's keys in the columns ``V:`` and its values in the
  rows ``K:`` (with ``R = 1`` the SISO state of ``pack_mamba3_state``)."""
  ssm = jnp.asarray(ssm, _F32)
  k_last, v_last = jnp.asarray(k_last, _F32), jnp.asarray(v_last, _F32)
  rank = k_last.shape[-2]
  top = jnp.concatenate([ssm, jnp.swapaxes(k_last, -1, -2)],
                        axis=-1)                        # [B, H, K, V + R]
  bottom = jnp.concatenate(
      [v_last, jnp.zeros(v_last.shape[:-1] + (rank,), _F32)],
      axis=-1)                                          # [B, H, R, V + R]
  return jnp.concatenate([top, bottom], axis=-2)


def unpack_mamba3_mimo_state(state, rank):
  """The MIMO state ``[B, H, K + R, V + R]`` -> ``(S^ [B, H, K, V], k [B,
  H, R, K], v [B, H, R, V])``, float32."""
  state = jnp.asarray(state, _F32)
  return (state[..., :-rank, :-rank],
          jnp.swapaxes(state[..., :-rank, -rank:], -1, -2),
          state[..., -rank:, :-rank])


def mimo_from_reference_state(angle, ssm, k_last, v_last):
  """The reference's MIMO state (``Angle_State [B, H, A]``, ``SSM_State
  [B, H, V, K]``, ``K_State [B, H, R, K]``, ``V_State [B, H, R, V]``, keys
  paired ``(2i, 2i + 1)`` as in its ``mamba3_MIMO_step_ref``) -> ours."""
  angle = jnp.asarray(angle, _F32)
  return pack_mamba3_mimo_state(
      rotate_rows(jnp.swapaxes(jnp.asarray(ssm, _F32), -1, -2), -angle),
      rotate(k_last, -angle[..., None, :]), v_last)


def mimo_to_reference_state(state, angle, rank):
  """Ours, with the cumulative angles ``phi [B, H, A]`` -> the reference's
  ``(SSM_State [B, H, V, K], K_State [B, H, R, K], V_State [B, H, R,
  V])``."""
  ssm, k_last, v_last = unpack_mamba3_mimo_state(state, rank)
  angle = jnp.asarray(angle, _F32)
  return (jnp.swapaxes(rotate_rows(ssm, angle), -1, -2),
          rotate(k_last, angle[..., None, :]), v_last)


def interleave_halves(x):
  """Reorders the last axis ``N`` so that the pairs ``(i, i + N / 2)``
  become ``(2i, 2i + 1)``: the reference's MIMO kernels rotate the halves'
  pairs, the op the neighbours'; a permutation of the state's axis changes
  no output."""
  n = x.shape[-1]
  return jnp.stack([x[..., :n // 2], x[..., n // 2:]],
                   axis=-1).reshape(x.shape)
