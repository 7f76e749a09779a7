"""The definition of the mLSTM, one token at a time, as xLSTM-7B computes
it (``mlstm_recurrent_step_native`` of transformers' ``models/xlstm``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.mlstm.inputs import (EPS, default_scale,
                                           pack_mlstm_state,
                                           unpack_mlstm_state, validate,
                                           zero_state)

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_mlstm(q, k, v, i, f, *, scale=None, eps=EPS,
                          initial_state=None, output_final_state=False,
                          segment_ids=None):
  """The mLSTM (Beck et al. 2024, https://arxiv.org/abs/2405.04517), with
  the exponential input gate and the max state ``m`` that stabilises it::

      m_t = max(log f_t + m_{t-1}, i_t)          log f_t = log_sigmoid(f_t)
      C_t = exp(log f_t + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T
      n_t = exp(log f_t + m_{t-1} - m_t) n_{t-1} + exp(i_t - m_t) k_t
      h_t = C_t^T q~_t / (max(|n_t . q~_t|, exp(-m_t)) + eps)

  with ``q~ = scale q``: the stabilised form of ``C_t = f_t C_{t-1} +
  exp(i_t) k_t v_t^T``, ``h_t = C_t^T q~_t / max(|n_t . q~_t|, 1)`` (the
  ``eps`` term, ``eps exp(m_t)`` in those units, is the reference's). The
  output gate and the head norm are the layer's. At a document start the
  state ``(C, n, m)`` is replaced by zeros.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    i: ``[B, T, H]`` input gate pre-activations (the log of the input gate).
    f: ``[B, T, H]`` forget gate pre-activations (``log_sigmoid`` of them
      is the log forget gate).
    scale: query scale, ``K ** -0.5`` when None.
    eps: added to the denominator.
    initial_state: ``[B, H, K, V + 2]`` float32, ``[C | n | m]``
      (``inputs.pack_mlstm_state``), or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int; the state resets where the id changes.
  Returns:
    ``(h [B, T, H, V] in v's dtype, final state [B, H, K, V + 2] float32 or
    None)``.
  """
  b, t, h, dk, dv = validate(q, k, v, i, f, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  state = (zero_state(b, h, dk, dv) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  reset = reset_flags(segment_ids, b, t)

  def step(carry, inputs):
    c, n, m = carry                                  # [B,H,K,V], [B,H,K], [B,H]
    q_t, k_t, v_t, i_t, f_t, reset_t = inputs
    c, n, m = (jnp.where(reset_t.reshape((-1,) + (1,) * (x.ndim - 1)), 0.0, x)
               for x in (c, n, m))
    log_f = jax.nn.log_sigmoid(f_t)                                # [B, H]
    m_new = jnp.maximum(log_f + m, i_t)
    forget = jnp.exp(log_f + m - m_new)
    write = jnp.exp(i_t - m_new)
    c = (forget[..., None, None] * c
         + write[..., None, None] * k_t[..., :, None] * v_t[..., None, :])
    n = forget[..., None] * n + write[..., None] * k_t
    q_t = scale * q_t
    num = jnp.einsum("bhk,bhkv->bhv", q_t, c, precision=_HIGHEST)
    den = jnp.einsum("bhk,bhk->bh", q_t, n, precision=_HIGHEST)
    den = jnp.maximum(jnp.abs(den), jnp.exp(-m_new))[..., None] + eps
    return (c, n, m_new), num / den

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0)
                for x in (q, k, v, i, f)]
  (c, n, m), o = jax.lax.scan(step, unpack_mlstm_state(state),
                              (*time_major, reset.T))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)                     # [B, T, H, V]
  return o, (pack_mlstm_state(c, n, m) if output_final_state else None)
