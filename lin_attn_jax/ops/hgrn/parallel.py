"""HGRN as one associative scan over time."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.diagonal_ssm.parallel import parallel_scan_f32
from lin_attn_jax.ops.diagonal_ssm.scan import keep_flags
from lin_attn_jax.ops.hgrn.inputs import validate

_F32 = jnp.float32


def parallel_hgrn(x, g, *, initial_state=None, output_final_state=False,
                  segment_ids=None):
  """``parallel_linear_scan`` with ``a = exp(g)``."""
  batch, length, _ = validate(x, g, initial_state, segment_ids)
  h0 = None if initial_state is None else jnp.asarray(initial_state, _F32)
  h, final = parallel_scan_f32(jnp.exp(jnp.asarray(g, _F32)),
                               jnp.asarray(x, _F32),
                               keep_flags(segment_ids, batch, length), h0)
  return h.astype(x.dtype), (final if output_final_state else None)
