"""The linear scan as one associative (parallel prefix) scan over time."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.diagonal_ssm.bidirectional import lion_scan
from lin_attn_jax.ops.diagonal_ssm.inputs import validate
from lin_attn_jax.ops.diagonal_ssm.scan import (associative_linear_scan,
                                                expand_like, keep_flags)


def parallel_scan_f32(a, b, keep, initial_state):
  """Float32 ``[B, T, ...]`` coefficients, ``keep [B, T]`` -> ``(h, h_T)``."""
  h = associative_linear_scan(a * expand_like(keep, a), b, initial_state)
  return h, h[:, -1]


def parallel_noncausal_scan(a, b, segment_ids):
  """``parallel_scan_f32``'s states from zero, as ``lion_scan`` calls it."""
  keep = keep_flags(segment_ids, a.shape[0], a.shape[1])
  return parallel_scan_f32(a, b, keep, None)[0]


def parallel_linear_scan(a, b, *, initial_state=None, output_final_state=False,
                         segment_ids=None, causal=True):
  """``lax.associative_scan`` over the whole sequence: depth ``O(log T)``.

  Shapes as in ``chunk_linear_scan`` (``causal=False``: forward and
  backward, ``bidirectional.py``).
  """
  batch, length, _ = validate(a, b, initial_state, segment_ids)
  check_no_state("parallel_linear_scan", causal, initial_state,
                 output_final_state)
  if not causal:
    return lion_scan(parallel_noncausal_scan, a, b,
                     segment_ids).astype(b.dtype), None
  h0 = (None if initial_state is None
        else jnp.asarray(initial_state, jnp.float32))
  h, final = parallel_scan_f32(jnp.asarray(a, jnp.float32),
                               jnp.asarray(b, jnp.float32),
                               keep_flags(segment_ids, batch, length), h0)
  return h.astype(b.dtype), (final if output_final_state else None)
