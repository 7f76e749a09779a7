"""The chunkwise form of the RG-LRU."""

from __future__ import annotations

import functools

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.diagonal_ssm.chunk import chunk_noncausal_scan
from lin_attn_jax.ops.diagonal_ssm.chunk import chunk_scan_f32
from lin_attn_jax.ops.diagonal_ssm.scan import keep_flags
from lin_attn_jax.ops.rg_lru.bidirectional import noncausal_rg_lru
from lin_attn_jax.ops.rg_lru.coefficients import rg_lru_coefficients
from lin_attn_jax.ops.rg_lru.inputs import validate


def chunk_rg_lru(x, a_gate, x_gate, a_param, *, c=8.0, initial_state=None,
                 output_final_state=False, segment_ids=None, chunk_size=64,
                 unscaled=None, causal=True):
  """Griffin's RG-LRU; ``chunk_linear_scan`` of its coefficients.

  Args:
    x: ``[B, T, D]`` input.
    a_gate: ``[B, T, D]`` recurrence-gate pre-activation.
    x_gate: ``[B, T, D]`` input-gate pre-activation.
    a_param: ``[D]``; the per-token decay is ``exp(-c r_t softplus(a_param))``.
    c: the constant ``c`` of the paper (8).
    initial_state: ``[B, D]`` float32, or None for zeros.
    output_final_state: also return the last state.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk (speed only).
    unscaled: ``[B, T]`` bool or None: True where the input is not scaled
      by ``sqrt(1 - a_t^2)`` (the reference implementations' first token of
      a document).
    causal: False for the non-causal form (``bidirectional.py``); no state.
  Returns:
    ``(h [B, T, D] in x's dtype, final_state [B, D] float32 or None)``.

  Example:
    >>> x = a_gate = x_gate = jnp.ones((2, 100, 8)); a_param = jnp.ones((8,))
    >>> h, s = chunk_rg_lru(x, a_gate, x_gate, a_param, output_final_state=True)
    >>> h.shape, s.shape
    ((2, 100, 8), (2, 8))
  """
  batch, _ = validate(x, a_gate, x_gate, a_param, initial_state, segment_ids,
                      step=False, unscaled=unscaled)
  checks.check_chunk_size(chunk_size)
  check_no_state("chunk_rg_lru", causal, initial_state, output_final_state)
  if not causal:
    scan = functools.partial(chunk_noncausal_scan, chunk_size=chunk_size)
    return noncausal_rg_lru(scan, x, a_gate, x_gate, a_param, c=c,
                            segment_ids=segment_ids, unscaled=unscaled)
  a, b = rg_lru_coefficients(x, a_gate, x_gate, a_param, c, unscaled)
  h, final = chunk_scan_f32(a, b, keep_flags(segment_ids, batch, x.shape[1]),
                            initial_state, chunk_size)
  return h.astype(x.dtype), (final if output_final_state else None)
