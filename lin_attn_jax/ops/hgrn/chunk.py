"""The chunkwise form of HGRN."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.diagonal_ssm.chunk import chunk_scan_f32
from lin_attn_jax.ops.diagonal_ssm.scan import keep_flags
from lin_attn_jax.ops.hgrn.inputs import validate

_F32 = jnp.float32


def chunk_hgrn(x, g, *, initial_state=None, output_final_state=False,
               segment_ids=None, chunk_size=64):
  """HGRN's recurrence ``h_t = exp(g_t) h_{t-1} + x_t``, chunkwise.

  Args:
    x: ``[B, T, D]`` input (already scaled by ``1 - exp(g)``).
    g: ``[B, T, D]`` log forget gate, ``<= 0``.
    initial_state: ``[B, D]`` float32, or None for zeros.
    output_final_state: also return the last state.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk (speed only).
  Returns:
    ``(h [B, T, D] in x's dtype, final_state [B, D] float32 or None)``.

  Example:
    >>> x = jnp.ones((2, 100, 8)); g = jnp.full((2, 100, 8), -0.1)
    >>> h, s = chunk_hgrn(x, g, output_final_state=True)
    >>> h.shape, s.shape
    ((2, 100, 8), (2, 8))
  """
  batch, length, _ = validate(x, g, initial_state, segment_ids)
  checks.check_chunk_size(chunk_size)
  h, final = chunk_scan_f32(jnp.exp(jnp.asarray(g, _F32)),
                            jnp.asarray(x, _F32),
                            keep_flags(segment_ids, batch, length),
                            initial_state, chunk_size)
  return h.astype(x.dtype), (final if output_final_state else None)
