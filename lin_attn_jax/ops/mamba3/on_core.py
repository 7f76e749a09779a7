"""Mamba-3 on the gated-linear core.

With the cumulative angles from the sequence's start ``psi_t = theta_1 +
... + theta_t`` (mod 2 pi), the rotated queries and keys ``q~ = R(psi) q``,
``k~ = R(psi) k`` and the trapezoid's weights ``gamma_t = lambda_t dt_t``,
``beta'_t = (1 - lambda_t) dt_t``, token ``s``'s key and value are written
twice: with ``gamma_s`` at ``s`` and with ``beta'_{s+1}`` at ``s + 1``,
where the write decays by ``exp(g_{s+1})`` exactly as a write at ``s``
would. So the state in the frame of ``psi`` is

    S_t = sum_{s <= t} exp(g_{s+1} + ... + g_t) w_s k~_s v_s^T
          - beta'_{t+1} k~_t v_t^T,      w_s = gamma_s + beta'_{s+1},

the core's recurrence ``S_t = exp(g_t) S_{t-1} + k'_t v_t^T`` with keys
``k' = w k~``, less the second write of token t, which has not happened yet
at t. Hence

    o_t = core(q~, w k~, v, g)_t - beta'_{t+1} (q~_t . k~_t) v_t,

the core's state after the last token is ``R(psi_T) S^_T`` (``beta'_{T+1}
= 0``), and the initial state enters as ``S^_0 + beta'_1 k_0 v_0^T`` (its
frame is ``psi = 0``). ``beta'`` is 0 at a document start (the previous
token is another document's), so a document's last token is written once.
Only differences of angles reach the outputs, so ``psi`` need not restart
at documents.

``psi`` is a sum modulo 2 pi, so ``jax.lax.associative_scan`` gives it.
Under a ``sequence`` mesh axis each device scans its own tokens, the last
sum of each device is all-gathered and summed over the devices before it,
and the last token's ``beta'_{t+1}`` comes from the next device's first
token (one ``ppermute``); the core then splits the sequence itself.

MIMO (``R`` keys, values and queries per token) runs the core on ``R T``
sub-steps, token t's rank r at ``t R + r``: the decay ``g_t`` on the first
sub-step and 0 on the others, the key ``w_t k~_{t,r}``, the value
``v_{t,r}`` and the query ``q~_{t,r}``. The read at sub-step ``(t, r)``
then lacks the writes of the ranks after r, which the token's ``R x R``
scores add back (and the pending second write, as above, leaves):

    o_{t,r} = core_{tR+r} + sum_{r'} (q~_{t,r} . k~_{t,r'})
              (w_t [r' > r] - beta'_{t+1}) v_{t,r'}.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.mamba3.inputs import (angle_steps, mimo_state_shape,
                                            pack_mamba3_mimo_state,
                                            pack_mamba3_state, rotate,
                                            rotate_rows, trapezoid,
                                            unpack_mamba3_mimo_state,
                                            unpack_mamba3_state, validate,
                                            validate_mimo,
                                            validate_mimo_step, validate_step,
                                            wrap, zero_state)

_F32 = jnp.float32


def _cumulative(theta):
  """``theta_1 + ... + theta_t`` modulo 2 pi along axis 1."""
  return jax.lax.associative_scan(lambda a, b: wrap(a + b), theta, axis=1)


def _shift_left(x, last):
  """``x[:, t + 1]`` at t, ``last`` at the end (``x [B, L, H]``)."""
  return jnp.concatenate([x[:, 1:], last[:, None]], axis=1)


def angles_and_shift(theta, beta, segment_ids):
  """``(psi [B, T, H, A], beta' [B, T, H] zeroed at document starts,
  beta'_{t+1} [B, T, H])``."""
  if cp.sequence_parallel_size() > 1:
    return _split_angles_and_shift(theta, beta, segment_ids)
  b, t = beta.shape[:2]
  beta = jnp.where(reset_flags(segment_ids, b, t)[..., None], 0.0, beta)
  return (_cumulative(theta), beta,
          _shift_left(beta, jnp.zeros_like(beta[:, 0])))


def _split_angles_and_shift(theta, beta, segment_ids,
                            axis_name=cp.SEQUENCE_AXIS):
  parts = cp.axis_size(axis_name)
  cp.local_length(beta.shape[1], parts, axis_name)

  def device(split, whole):
    del whole
    theta, beta, ids = split
    b, length = beta.shape[:2]
    reset = reset_flags(ids, b, length)
    starts = cp.document_starts(ids, axis_name)
    if starts is not None:
      reset = reset.at[:, 0].set(starts[cp.device_index(axis_name)])
    beta = jnp.where(reset[..., None], 0.0, beta)
    psi = _cumulative(theta)                                    # [B, L, H, A]
    totals = jax.lax.all_gather(psi[:, -1], axis_name)          # [P, B, H, A]
    before = jnp.arange(parts) < cp.device_index(axis_name)
    entering = jnp.sum(jnp.where(before[:, None, None, None], totals, 0.0),
                       axis=0)                                  # [B, H, A]
    following = jax.lax.ppermute(beta[:, 0], axis_name,
                                 [(i + 1, i) for i in range(parts - 1)])
    return (wrap(psi + entering[:, None]), beta,
            _shift_left(beta, following)), None

  out, _ = cp.map_sequence(device, (theta, beta, segment_ids), (),
                           axis_name=axis_name)
  return out


def run_on_core(core_form, q, k, v, g, dt, trap, angles, *,
                initial_state=None, output_final_state=False,
                segment_ids=None, **options):
  """A Mamba-3 sequence form from the core's ``core_form`` (a chunk,
  parallel or recurrent form of ``lin_attn_jax.ops.gated_linear``);
  arguments as in ``naive_recurrent_mamba3``, ``options`` to the core."""
  validate(q, k, v, g, dt, trap, angles, initial_state, segment_ids)
  gamma, beta = trapezoid(dt, trap)                             # [B, T, H]
  psi, beta, following = angles_and_shift(angle_steps(angles, dt), beta,
                                          segment_ids)
  q_rot, k_rot = rotate(q, psi), rotate(k, psi)                 # [B, T, H, K]
  vf = jnp.asarray(v, _F32)
  core_state = None
  if initial_state is not None:
    ssm0, k0, v0 = unpack_mamba3_state(initial_state)
    core_state = ssm0 + jnp.einsum("bh,bhk,bhv->bhkv", beta[:, 0], k0, v0)
  o, final = core_form(
      q_rot, k_rot * (gamma + following)[..., None], vf,
      jnp.asarray(g, _F32), scale=1.0, initial_state=core_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      **options)
  diagonal = jnp.einsum("bthk,bthk->bth", q_rot, k_rot) * following
  o = (o - diagonal[..., None] * vf).astype(v.dtype)            # [B, T, H, V]
  if not output_final_state:
    return o, None
  return o, pack_mamba3_state(rotate_rows(final, -psi[:, -1]),
                              jnp.asarray(k[:, -1], _F32), vf[:, -1])


def step_on_core(core_step, q, k, v, g, dt, trap, angles, state=None, *,
                 reset=None):
  """One token through the core's ``gated_linear_step``: the previous
  token's pending write joins ``S^``, which turns by ``-theta_t``, then the
  core decays it and writes ``gamma_t k_t v_t^T``."""
  b, h, dk, dv, _ = validate_step(q, k, v, g, dt, trap, angles, state, reset)
  state = (zero_state(b, h, dk, dv) if state is None
           else jnp.asarray(state, _F32))
  if reset is not None:
    state = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, state)
  ssm, k_last, v_last = unpack_mamba3_state(state)
  gamma, beta = trapezoid(dt, trap)                             # [B, H]
  ssm = rotate_rows(
      ssm + jnp.einsum("bh,bhk,bhv->bhkv", beta, k_last, v_last),
      -angle_steps(angles, dt))                                 # [B, H, K, V]
  kf, vf = jnp.asarray(k, _F32), jnp.asarray(v, _F32)
  o, ssm = core_step(jnp.asarray(q, _F32), kf * gamma[..., None], vf,
                     jnp.asarray(g, _F32), ssm, scale=1.0)
  return o.astype(v.dtype), pack_mamba3_state(ssm, kf, vf)


def _tokens_to_substeps(x):
  """``[B, T, H, R, ...] -> [B, T R, H, ...]``, token t's rank r at ``t R +
  r``."""
  x = jnp.moveaxis(x, 3, 2)                                  # [B, T, R, H, ...]
  return x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])


def _substeps_to_tokens(x, rank):
  """The inverse of ``_tokens_to_substeps``."""
  x = x.reshape((x.shape[0], x.shape[1] // rank, rank) + x.shape[2:])
  return jnp.moveaxis(x, 2, 3)


def run_mimo_on_core(core_form, q, k, v, g, dt, trap, angles, *,
                     initial_state=None, output_final_state=False,
                     segment_ids=None, **options):
  """A Mamba-3 MIMO sequence form from the core's ``core_form`` on ``R T``
  sub-steps (module docstring); arguments as in
  ``naive_recurrent_mamba3_mimo``, ``options`` to the core."""
  _, _, _, rank, _, _, _ = validate_mimo(q, k, v, g, dt, trap, angles,
                                         initial_state, segment_ids)
  gamma, beta = trapezoid(dt, trap)                             # [B, T, H]
  psi, beta, following = angles_and_shift(angle_steps(angles, dt), beta,
                                          segment_ids)
  psi_r = psi[:, :, :, None]                                    # [B, T, H, 1, A]
  q_rot, k_rot = rotate(q, psi_r), rotate(k, psi_r)          # [B, T, H, R, K]
  vf = jnp.asarray(v, _F32)
  weight = gamma + following                                    # [B, T, H]
  g_sub = jnp.zeros(vf.shape[:4], _F32).at[..., 0].set(
      jnp.asarray(g, _F32))                                     # [B, T, H, R]
  core_state = None
  if initial_state is not None:
    ssm0, k0, v0 = unpack_mamba3_mimo_state(initial_state, rank)
    core_state = ssm0 + jnp.einsum("bh,bhrk,bhrv->bhkv", beta[:, 0], k0, v0)
  o, final = core_form(
      _tokens_to_substeps(q_rot),
      _tokens_to_substeps(k_rot * weight[..., None, None]),
      _tokens_to_substeps(vf), _tokens_to_substeps(g_sub[..., None])[..., 0],
      scale=1.0, initial_state=core_state,
      output_final_state=output_final_state,
      segment_ids=(None if segment_ids is None
                   else jnp.repeat(segment_ids, rank, axis=1)), **options)
  later = jnp.triu(jnp.ones((rank, rank), _F32), 1)             # [r, r'] r' > r
  scores = jnp.einsum("bthrk,bthsk->bthrs", q_rot, k_rot) * (
      weight[..., None, None] * later
      - following[..., None, None])                          # [B, T, H, R, R]
  o = _substeps_to_tokens(o, rank) + jnp.einsum("bthrs,bthsv->bthrv", scores,
                                                vf)
  o = o.astype(v.dtype)                                      # [B, T, H, R, V]
  if not output_final_state:
    return o, None
  return o, pack_mamba3_mimo_state(rotate_rows(final, -psi[:, -1]),
                                   jnp.asarray(k[:, -1], _F32), vf[:, -1])


def mimo_step_on_core(q, k, v, g, dt, trap, angles, state=None, *,
                      reset=None):
  """One MIMO token: the previous token's pending writes join ``S^``, which
  turns by ``-theta_t`` and decays; the token's ``R`` writes follow, then
  its ``R`` reads (no core step: the core's writes one rank-1 term)."""
  b, h, rank, dk, dv, _ = validate_mimo_step(q, k, v, g, dt, trap, angles,
                                             state, reset)
  state = (jnp.zeros(mimo_state_shape(b, h, rank, dk, dv), _F32)
           if state is None else jnp.asarray(state, _F32))
  if reset is not None:
    state = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, state)
  ssm, k_last, v_last = unpack_mamba3_mimo_state(state, rank)
  gamma, beta = trapezoid(dt, trap)                             # [B, H]
  ssm = rotate_rows(
      ssm + jnp.einsum("bh,bhrk,bhrv->bhkv", beta, k_last, v_last),
      -angle_steps(angles, dt))                                 # [B, H, K, V]
  kf, vf = jnp.asarray(k, _F32), jnp.asarray(v, _F32)
  ssm = (jnp.exp(jnp.asarray(g, _F32))[..., None, None] * ssm
         + jnp.einsum("bh,bhrk,bhrv->bhkv", gamma, kf, vf))
  o = jnp.einsum("bhrk,bhkv->bhrv", jnp.asarray(q, _F32), ssm)
  return o.astype(v.dtype), pack_mamba3_mimo_state(ssm, kf, vf)
