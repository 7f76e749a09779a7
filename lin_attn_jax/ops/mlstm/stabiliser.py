"""The max state ``m_t = max(log f_t + m_{t-1}, i_t)`` over a sequence.

A max-plus recurrence: token t maps ``m -> max(a_t + m, b_t)`` with ``a_t =
log f_t``, ``b_t = i_t``. Maps of this form compose into maps of the same
form, ``(a1, b1)`` then ``(a2, b2)`` being ``(a1 + a2, max(b1 + a2, b2))``,
so ``jax.lax.associative_scan`` gives every ``m_t`` in ``log2(T)`` levels;
``a`` sums log-gates ``<= 0`` and no two sums are subtracted. A document
start replaces ``m_{t-1}`` by 0 (the zero state): the token's map is then
the constant ``(-inf, max(log f_t, i_t))``.

Under a ``sequence`` mesh axis each device scans its own tokens; the last
map of every device (two numbers per row and head) is all-gathered and
composed over the devices from the initial ``m``, which gives each device
its entering ``m`` (0 where a document starts at its first token).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common.segments import reset_flags

_F32 = jnp.float32


def _compose(first, second):
  a1, b1 = first
  a2, b2 = second
  return a1 + a2, jnp.maximum(b1 + a2, b2)


def _maps(log_f, i, segment_ids):
  """Each token's map ``(a, b)`` and the reset flags, ``[B, T, H]`` and
  ``[B, T]``, scanned: the map from the sequence's start to each token."""
  b, t = log_f.shape[:2]
  reset = reset_flags(segment_ids, b, t)[..., None]             # [B, T, 1]
  a = jnp.where(reset, -jnp.inf, log_f)
  first = jnp.where(reset, jnp.maximum(log_f, i), i)
  return jax.lax.associative_scan(_compose, (a, first), axis=1), reset


def _apply(maps, m_entering, reset):
  """``m [B, T, H]`` and ``m_{t-1}`` (0 after a document start) from the
  scanned maps and the entering ``m [B, H]``."""
  a, b = maps
  m = jnp.maximum(a + m_entering[:, None], b)                   # [B, T, H]
  previous = jnp.concatenate([m_entering[:, None], m[:, :-1]], axis=1)
  return m, jnp.where(reset, 0.0, previous)


def max_state(log_f, i, m_initial, segment_ids):
  """``(m, m_previous)``, each ``[B, T, H]`` float32.

  Args:
    log_f: ``[B, T, H]`` log forget gates ``<= 0``; i: ``[B, T, H]`` log
      input gates; m_initial: ``[B, H]``, the ``m`` before the first token;
      segment_ids: ``[B, T]`` or None.
  Returns:
    ``m_t`` and ``m_{t-1}`` (``m_initial`` at t = 0, 0 at a document
    start), so that ``log f_t + m_{t-1} - m_t <= 0`` is the log-decay of the
    stabilised state.
  """
  if cp.sequence_parallel_size() > 1:
    return _split_max_state(log_f, i, m_initial, segment_ids)
  maps, reset = _maps(log_f, i, segment_ids)
  return _apply(maps, m_initial, reset)


def _split_max_state(log_f, i, m_initial, segment_ids,
                     axis_name=cp.SEQUENCE_AXIS):
  cp.local_length(log_f.shape[1], cp.axis_size(axis_name), axis_name)

  def device(split, whole):
    log_f, i, ids = split
    (m_initial,) = whole
    maps, reset = _maps(log_f, i, ids)
    last = jax.tree.map(lambda x: x[:, -1], maps)               # [B, H] each
    a_all, b_all = jax.lax.all_gather(last, axis_name)          # [P, B, H]
    starts = cp.document_starts(ids, axis_name)
    if starts is None:
      starts = jnp.zeros(a_all.shape[:2], bool)

    def combine(m, xs):
      a_p, b_p, start_p = xs
      entering = jnp.where(start_p[:, None], 0.0, m)
      return jnp.maximum(a_p + entering, b_p), entering

    _, entering = jax.lax.scan(combine, m_initial, (a_all, b_all, starts))
    return _apply(maps, entering[cp.device_index(axis_name)], reset), None

  (m, previous), _ = cp.map_sequence(device, (log_f, i, segment_ids),
                                     (m_initial,), axis_name=axis_name)
  return m, previous
