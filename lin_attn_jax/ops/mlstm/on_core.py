"""The mLSTM on the gated-linear core.

With the max state ``m_t`` (``stabiliser.py``) the stabilised memory
``C~_t = exp(-m_t) C_t`` and normaliser ``n~_t = exp(-m_t) n_t`` follow

    C~_t = exp(g_t) C~_{t-1} + k'_t v_t^T,   n~_t = exp(g_t) n~_{t-1} + k'_t
    g_t = log f_t + m_{t-1} - m_t <= 0,       k'_t = exp(i_t - m_t) k_t

which is the core's recurrence with a scalar log-decay per head, the keys
``k'`` and the values ``[v | 1]``: the core's state ``[B, H, K, V + 1]`` is
``[C~ | n~]`` and its output ``[C~^T q | n~ . q]`` (q scaled), whence

    h_t = (C~_t^T q_t) / (max(|n~_t . q_t|, exp(-m_t)) + eps).

Every exponential is of a number ``<= 0``. The core's forms (chunk,
parallel, recurrent, step) then run unchanged: their segment ids reset
``C~`` and ``n~``, the max-state scan resets ``m``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.mlstm.inputs import (EPS, pack_mlstm_state,
                                           unpack_mlstm_state, validate,
                                           validate_step, zero_state)
from lin_attn_jax.ops.mlstm.stabiliser import max_state

_F32 = jnp.float32


def core_inputs(k, v, i, log_f, m, m_previous):
  """``(k', [v | 1], g)`` of the core from the keys, values, gates and the
  max state (any leading axes; ``i``, ``log_f``, ``m`` without the last
  axis of ``k``)."""
  g = jnp.minimum(log_f + m_previous - m, 0.0)
  k_in = jnp.asarray(k, _F32) * jnp.exp(i - m)[..., None]
  vf = jnp.asarray(v, _F32)
  return k_in, jnp.concatenate([vf, jnp.ones_like(vf[..., :1])], -1), g


def normalise(o_aug, m, eps, dtype):
  """``h = num / (max(|den|, exp(-m)) + eps)`` from the core's output
  ``[num | den]``."""
  den = jnp.maximum(jnp.abs(o_aug[..., -1:]), jnp.exp(-m)[..., None])
  return (o_aug[..., :-1] / (den + eps)).astype(dtype)


def run_on_core(core_form, q, k, v, i, f, *, scale=None, eps=EPS,
                initial_state=None, output_final_state=False,
                segment_ids=None, **options):
  """An mLSTM sequence form from the core's ``core_form`` (a chunk,
  parallel or recurrent form of ``lin_attn_jax.ops.gated_linear``);
  arguments as in ``naive_recurrent_mlstm``, ``options`` to the core."""
  b, _, h, dk, dv = validate(q, k, v, i, f, initial_state, segment_ids)
  state = (zero_state(b, h, dk, dv) if initial_state is None
           else jnp.asarray(initial_state, _F32))
  _, _, m0 = unpack_mlstm_state(state)
  log_f = jax.nn.log_sigmoid(jnp.asarray(f, _F32))
  i = jnp.asarray(i, _F32)
  m, m_previous = max_state(log_f, i, m0, segment_ids)
  k_in, v_in, g = core_inputs(k, v, i, log_f, m, m_previous)
  o, final = core_form(
      q, k_in, v_in, g, scale=scale,
      initial_state=None if initial_state is None else state[..., :-1],
      output_final_state=output_final_state, segment_ids=segment_ids,
      **options)
  h_out = normalise(o, m, eps, v.dtype)
  if not output_final_state:
    return h_out, None
  return h_out, pack_mlstm_state(final[..., :-1], final[..., -1], m[:, -1])


def step_on_core(core_step, q, k, v, i, f, state=None, *, scale=None,
                 eps=EPS, reset=None):
  """One token through the core's ``gated_linear_step``: ``m`` first, then
  ``C~`` and ``n~``."""
  b, h, dk, dv = validate_step(q, k, v, i, f, state, reset)
  state = (zero_state(b, h, dk, dv) if state is None
           else jnp.asarray(state, _F32))
  if reset is not None:
    state = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, state)
  _, _, m_previous = unpack_mlstm_state(state)
  log_f = jax.nn.log_sigmoid(jnp.asarray(f, _F32))
  i = jnp.asarray(i, _F32)
  m = jnp.maximum(log_f + m_previous, i)                        # [B, H]
  k_in, v_in, g = core_inputs(k, v, i, log_f, m, m_previous)
  o, core_state = core_step(q, k_in, v_in, g, state[..., :-1], scale=scale)
  return (normalise(o, m, eps, v.dtype),
          pack_mlstm_state(core_state[..., :-1], core_state[..., -1], m))
