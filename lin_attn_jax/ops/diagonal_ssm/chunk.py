"""The linear scan chunk by chunk: all chunks at once inside, a scan between."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks, context_parallel
from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.diagonal_ssm import context_parallel as split
from lin_attn_jax.ops.diagonal_ssm.bidirectional import lion_scan
from lin_attn_jax.ops.diagonal_ssm.inputs import initial, validate
from lin_attn_jax.ops.diagonal_ssm.scan import (chunked_linear_scan,
                                                expand_like, keep_flags)


@context_parallel.splits_sequence(lambda: split.context_parallel_scan_f32)
def chunk_scan_f32(a, b, keep, initial_state, chunk_size):
  """Float32 ``[B, T, ...]`` coefficients, ``keep [B, T]`` -> ``(h, h_T)``."""
  state = initial(initial_state, (a.shape[0],) + a.shape[2:], a.dtype)
  return chunked_linear_scan(a * expand_like(keep, a), b, state, chunk_size)


def chunk_noncausal_scan(a, b, segment_ids, *, chunk_size):
  """``chunk_scan_f32``'s states from zero, as ``lion_scan`` calls it."""
  keep = keep_flags(segment_ids, a.shape[0], a.shape[1])
  return chunk_scan_f32(a, b, keep, None, chunk_size)[0]


def chunk_linear_scan(a, b, *, initial_state=None, output_final_state=False,
                      segment_ids=None, chunk_size=64, causal=True):
  """``h_t = a_t * h_{t-1} + b_t`` over ``[B, T, D]``, returning every ``h_t``.

  Every chunk of ``chunk_size`` tokens is scanned from a zero state, all
  chunks side by side; a ``lax.scan`` over chunk ends then carries the state
  into every chunk (see ``scan.chunked_linear_scan``).

  Args:
    a: ``[B, T, D]`` decay (any real value; a decay needs ``|a| <= 1``).
    b: ``[B, T, D]`` input.
    initial_state: ``[B, D]`` float32 ``h_{-1}``, or None for zeros.
    output_final_state: also return ``h_{T-1}``.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk (speed only, not results).
    causal: False for the non-causal scan (``bidirectional.py``): every
      ``h_i`` sums its whole document, the decays between the two tokens
      multiplied in either direction; no state.
  Returns:
    ``(h [B, T, D] in b's dtype, final_state [B, D] float32 or None)``.

  Example:
    >>> a = jnp.full((2, 100, 8), 0.9); b = jnp.ones((2, 100, 8))
    >>> h, s = chunk_linear_scan(a, b, output_final_state=True)
    >>> h.shape, s.shape
    ((2, 100, 8), (2, 8))
  """
  batch, length, _ = validate(a, b, initial_state, segment_ids)
  checks.check_chunk_size(chunk_size)
  check_no_state("chunk_linear_scan", causal, initial_state,
                 output_final_state)
  if not causal:
    return lion_scan(functools.partial(chunk_noncausal_scan,
                                       chunk_size=chunk_size),
                     a, b, segment_ids).astype(b.dtype), None
  h, final = chunk_scan_f32(jnp.asarray(a, jnp.float32),
                            jnp.asarray(b, jnp.float32),
                            keep_flags(segment_ids, batch, length),
                            initial_state, chunk_size)
  return h.astype(b.dtype), (final if output_final_state else None)
