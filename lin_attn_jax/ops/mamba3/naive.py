"""The definition of Mamba-3's SISO recurrence, one token at a time: the
reference's ``mamba3_siso_step_ref`` (state-spaces/mamba,
``tests/ops/triton/test_mamba3_siso.py``) with the state in the frame of
the current token's rotation (README.md)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.mamba3.inputs import (angle_steps,
                                            mimo_state_shape,
                                            pack_mamba3_mimo_state,
                                            pack_mamba3_state, rotate_rows,
                                            trapezoid,
                                            unpack_mamba3_mimo_state,
                                            unpack_mamba3_state, validate,
                                            validate_mimo, zero_state)

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_mamba3(q, k, v, g, dt, trap, angles, *,
                           initial_state=None, output_final_state=False,
                           segment_ids=None):
  """Mamba-3 (Lahoti et al. 2026, "Mamba-3: Improved Sequence Modeling
  using State Space Principles"), the SISO recurrence per head::

      theta_t = tanh(angles_t) pi dt_t,   phi_t = phi_{t-1} + theta_t
      q~_t = R(phi_t) q_t,   k~_t = R(phi_t) k_t
      lambda_t = sigmoid(trap_t)
      S_t = exp(g_t) S_{t-1}
            + exp(g_t) (1 - lambda_t) dt_t k~_{t-1} v_{t-1}^T
            + lambda_t dt_t k~_t v_t^T
      o_t = S_t^T q~_t

  the trapezoidal discretisation of ``h' = A h + B x`` (the previous
  token's write decays with this token's ``exp(g) = exp(A dt)``), and the
  complex state as data-dependent rotations: ``R(phi)`` turns each pair
  ``(2i, 2i + 1)``, ``i < A``, of a ``K``-vector by ``phi[i]``. Only
  differences of angles reach the outputs, so the state is kept in the
  frame of the last rotation, ``S^_t = R(phi_t)^T S_t``::

      S^_t = exp(g_t) R(theta_t)^T (S^_{t-1}
                 + (1 - lambda_t) dt_t k_{t-1} v_{t-1}^T)
             + lambda_t dt_t k_t v_t^T
      o_t = S^_t^T q_t

  which is what this form computes. In the layer ``q = C``, ``k = B``
  (normalised, plus biases), ``v = x`` and ``g = A dt``; the skip ``D x``
  and the gate ``z`` are the layer's. At a document start ``S^``,
  ``k_{t-1}`` and ``v_{t-1}`` are zeros.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: ``[B, T, H]`` log-decays ``A dt <= 0``.
    dt: ``[B, T, H]`` time steps (``softplus`` of the layer's projection).
    trap: ``[B, T, H]`` pre-activations of ``lambda``.
    angles: ``[B, T, H, A]`` pre-activations of the rotation rates, ``1 <=
      A <= K / 2``.
    initial_state: ``[B, H, K + 1, V + 1]`` float32 (``S^``, ``k_{t-1}``,
      ``v_{t-1}``: ``pack_mamba3_state``), or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int; the state resets where the id changes.
  Returns:
    ``(o [B, T, H, V] in v's dtype, final state [B, H, K + 1, V + 1]
    float32 or None)``.
  """
  b, t, h, dk, dv, _ = validate(q, k, v, g, dt, trap, angles, initial_state,
                                segment_ids)
  state = (zero_state(b, h, dk, dv) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  reset = reset_flags(segment_ids, b, t)

  def step(carry, inputs):
    q_t, k_t, v_t, g_t, dt_t, trap_t, angles_t, reset_t = inputs
    carry = tuple(jnp.where(reset_t.reshape((-1,) + (1,) * (x.ndim - 1)),
                            0.0, x) for x in carry)
    ssm, k_last, v_last = carry
    gamma, beta = trapezoid(dt_t, trap_t)                       # [B, H]
    pending = ssm + (beta[..., None, None] * k_last[..., :, None]
                     * v_last[..., None, :])                    # [B, H, K, V]
    ssm = (jnp.exp(g_t)[..., None, None]
           * rotate_rows(pending, -angle_steps(angles_t, dt_t))
           + gamma[..., None, None] * k_t[..., :, None] * v_t[..., None, :])
    o_t = jnp.einsum("bhk,bhkv->bhv", q_t, ssm, precision=_HIGHEST)
    return (ssm, k_t, v_t), o_t

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0)
                for x in (q, k, v, g, dt, trap, angles)]
  carry, o = jax.lax.scan(step, unpack_mamba3_state(state),
                          (*time_major, reset.T))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)                     # [B, T, H, V]
  return o, (pack_mamba3_state(*carry) if output_final_state else None)


def naive_recurrent_mamba3_mimo(q, k, v, g, dt, trap, angles, *,
                                initial_state=None, output_final_state=False,
                                segment_ids=None):
  """Mamba-3 MIMO: the recurrence of ``naive_recurrent_mamba3`` with ``R``
  keys, values and queries per token and head (the reference's
  ``mamba3_MIMO_step_ref``, state-spaces/mamba,
  ``tests/ops/tilelang/test_mamba3_mimo.py``)::

      S_t = exp(g_t) S_{t-1}
            + exp(g_t) (1 - lambda_t) dt_t sum_r k~_{t-1,r} v_{t-1,r}^T
            + lambda_t dt_t sum_r k~_{t,r} v_{t,r}^T
      o_{t,r} = S_t^T q~_{t,r}

  one decay per token, then the ``R`` rank-1 writes of the token (and the
  trapezoid's ``R`` writes of the previous token), and ``R`` reads of the
  state after all of them. ``R(phi)`` turns the pairs ``(2i, 2i + 1)`` as
  in the SISO op (the reference's MIMO kernels turn ``(i, i + N / 2)``: a
  permutation of ``K`` that the layer applies, ``interleave_halves``). The
  state is kept in the frame of the last rotation as in the SISO op. With
  ``R = 1`` this is ``naive_recurrent_mamba3``.

  Args:
    q, k: ``[B, T, H, R, K]``; v: ``[B, T, H, R, V]``.
    g, dt, trap: ``[B, T, H]``; angles: ``[B, T, H, A]``, ``1 <= A <= K /
      2`` (as in ``naive_recurrent_mamba3``).
    initial_state: ``[B, H, K + R, V + R]`` float32 (``S^``, the last
      token's keys and values: ``pack_mamba3_mimo_state``), or None.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int; the state resets where the id changes.
  Returns:
    ``(o [B, T, H, R, V] in v's dtype, final state [B, H, K + R, V + R]
    float32 or None)``.
  """
  b, t, h, rank, dk, dv, _ = validate_mimo(q, k, v, g, dt, trap, angles,
                                           initial_state, segment_ids)
  state = (jnp.zeros(mimo_state_shape(b, h, rank, dk, dv), jnp.float32)
           if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  reset = reset_flags(segment_ids, b, t)

  def step(carry, inputs):
    q_t, k_t, v_t, g_t, dt_t, trap_t, angles_t, reset_t = inputs
    carry = tuple(jnp.where(reset_t.reshape((-1,) + (1,) * (x.ndim - 1)),
                            0.0, x) for x in carry)
    ssm, k_last, v_last = carry
    gamma, beta = trapezoid(dt_t, trap_t)                       # [B, H]
    pending = ssm + beta[..., None, None] * jnp.einsum(
        "bhrk,bhrv->bhkv", k_last, v_last, precision=_HIGHEST)
    ssm = (jnp.exp(g_t)[..., None, None]
           * rotate_rows(pending, -angle_steps(angles_t, dt_t))
           + gamma[..., None, None] * jnp.einsum(
               "bhrk,bhrv->bhkv", k_t, v_t,
               precision=_HIGHEST))                             # [B, H, K, V]
    o_t = jnp.einsum("bhrk,bhkv->bhrv", q_t, ssm, precision=_HIGHEST)
    return (ssm, k_t, v_t), o_t

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0)
                for x in (q, k, v, g, dt, trap, angles)]
  carry, o = jax.lax.scan(step, unpack_mamba3_mimo_state(state, rank),
                          (*time_major, reset.T))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)                  # [B, T, H, R, V]
  return o, (pack_mamba3_mimo_state(*carry) if output_final_state else None)
