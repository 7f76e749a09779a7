"""Mamba's selective scan split over a ``sequence`` mesh axis.

``h_t = exp(dt_t A) * h_{t-1} + dt_t u_t B_t`` per channel and state
entry. Device ``p``'s summary (``common/context_parallel.py``): its final
state from a zero state ``[B, D, N]`` (the chunk form run once more from
zero, recomputed in the backward pass rather than stored) and its decay
``exp(A sum_t dt_t)`` (0 where a document starts inside the device). One
all-gather of the ``P`` pairs and a prefix combine give each device its
entering state, then the chunk form runs from it. The state pass is a
whole scan here (the selective scan has no cheaper state-only form), so a
split costs about one more forward pass of the scan.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.chunk import chunk_noncausal_scan
from lin_attn_jax.ops.mamba import chunk
from lin_attn_jax.ops.mamba.bidirectional import noncausal_selective_scan
from lin_attn_jax.ops.mamba.inputs import CHUNK_SIZE, time_step, validate


def _scale(decay, state):
  return decay * state


def context_parallel_selective_scan(u, delta, A, B, C, *, D=None, z=None,
                                    delta_bias=None, delta_softplus=False,
                                    initial_state=None,
                                    output_final_state=False, segment_ids=None,
                                    chunk_size=CHUNK_SIZE, causal=True,
                                    axis_name=cp.SEQUENCE_AXIS,
                                    mesh=None):
  """``chunk_selective_scan`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_selective_scan``, plus ``axis_name``
  (T a multiple of its size) and ``mesh`` (None for the current one).
  ``chunk_selective_scan`` calls this itself when the current mesh has a
  ``"sequence"`` axis of size > 1. With ``causal=False`` the coefficients'
  linear scan runs both ways, each split as ``chunk_linear_scan`` splits
  (``bidirectional.py``).
  """
  dims = validate(u, delta, A, B, C, D, z, delta_bias, initial_state,
                  segment_ids)
  cp.local_length(u.shape[1], cp.axis_size(axis_name, mesh), axis_name)
  check_no_state("chunk_selective_scan", causal, initial_state,
                 output_final_state)
  if not causal:
    scan = functools.partial(chunk_noncausal_scan, chunk_size=chunk_size)
    return noncausal_selective_scan(
        scan, u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias,
        delta_softplus=delta_softplus, segment_ids=segment_ids, dims=dims)
  options = dict(delta_softplus=delta_softplus, chunk_size=chunk_size)

  def device(split, whole):
    u, delta, B, C, z, ids = split
    A, D, delta_bias, initial = whole

    def summary(u, delta, A, B, C, delta_bias):
      _, own = chunk.chunk_selective_scan(
          u, delta, A, B, C, delta_bias=delta_bias, output_final_state=True,
          segment_ids=ids, **options)
      dt = time_step(delta, delta_bias, delta_softplus)         # [B, L, D]
      decay = jnp.exp(jnp.sum(dt, axis=1)[..., None]
                      * jnp.asarray(A, jnp.float32))            # [B, D, N]
      batch, length = u.shape[:2]
      inside = jnp.any(reset_flags(ids, batch, length), axis=1)
      return own, jnp.where(inside[:, None, None], 0.0, decay)

    own, decay = jax.checkpoint(summary)(u, delta, A, B, C, delta_bias)
    entering, final = cp.carry_states(
        own, decay, _scale, initial, cp.document_starts(ids, axis_name),
        axis_name=axis_name)
    y, _ = chunk.chunk_selective_scan(
        u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias,
        initial_state=entering, segment_ids=ids, **options)
    return y, (final if output_final_state else None)

  return cp.map_sequence(device, (u, delta, B, C, z, segment_ids),
                         (A, D, delta_bias, initial_state),
                         axis_name=axis_name, mesh=mesh)
