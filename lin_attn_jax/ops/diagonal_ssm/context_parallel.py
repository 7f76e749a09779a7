"""The diagonal-SSM core split over a ``sequence`` mesh axis.

``h_t = a_t * h_{t-1} + b_t`` (elementwise): device ``p``'s summary
(``common/context_parallel.py``) is its last state from a zero state and
the product of its ``a_t`` (with ``a`` already 0 at document starts, device
boundaries included, so nothing else marks them). One all-gather of the
``P`` pairs and a prefix combine give each device its entering state; then
the chunked scan runs from it. ``linear_scan``, ``rg_lru`` and ``hgrn``
reach it through ``chunk_scan_f32``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.diagonal_ssm import chunk
from lin_attn_jax.ops.diagonal_ssm.inputs import validate
from lin_attn_jax.ops.diagonal_ssm.scan import expand_like, keep_flags


def _scale(decay, state):
  return decay * state


def context_parallel_scan_f32(a, b, keep, initial_state, chunk_size, *,
                              axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_scan_f32`` with T split over the devices of ``axis_name``.

  Float32 ``a, b: [B, T, ...]``, ``keep: [B, T]`` (0 where a document
  starts), ``initial_state [B, ...]`` or None. Returns ``(h, h_T)``.
  """
  cp.local_length(a.shape[1], cp.axis_size(axis_name, mesh), axis_name)

  def device(split, whole):
    a, b, keep = split
    (initial,) = whole

    def summary(a, b):
      _, own = chunk.chunk_scan_f32(a, b, keep, None, chunk_size)
      return own, jnp.prod(a * expand_like(keep, a), axis=1)

    own, decay = jax.checkpoint(summary)(a, b)
    entering, final = cp.carry_states(own, decay, _scale, initial, None,
                                      axis_name=axis_name)
    h, _ = chunk.chunk_scan_f32(a, b, keep, entering, chunk_size)
    return h, final

  return cp.map_sequence(device, (a, b, keep), (initial_state,),
                         axis_name=axis_name, mesh=mesh)


def context_parallel_linear_scan(a, b, *, initial_state=None,
                                 output_final_state=False, segment_ids=None,
                                 chunk_size=64, axis_name=cp.SEQUENCE_AXIS,
                                 mesh=None):
  """``chunk_linear_scan`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_linear_scan``, plus ``axis_name`` (T a
  multiple of its size) and ``mesh`` (None for the current one). RG-LRU and
  HGRN are this scan of their coefficients (``rg_lru_coefficients``;
  ``a = exp(g)``, ``b = x``); their chunk forms, like ``chunk_linear_scan``,
  split by themselves under a mesh with a ``"sequence"`` axis of size > 1.
  """
  batch, length, _ = validate(a, b, initial_state, segment_ids)
  checks.check_chunk_size(chunk_size)
  h, final = context_parallel_scan_f32(
      jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32),
      keep_flags(segment_ids, batch, length), initial_state, chunk_size,
      axis_name=axis_name, mesh=mesh)
  return h.astype(b.dtype), (final if output_final_state else None)
