"""One decoding step of the diagonal linear scan."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.diagonal_ssm.inputs import initial, validate_step


def linear_scan_step(a, b, state=None, *, reset=None):
  """One decoding step, O(1) in the context length.

  Args:
    a, b: ``[B, D]``.
    state: ``[B, D]`` float32 ``h_{t-1}``, or None for zeros.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(h_t [B, D] in b's dtype, h_t [B, D] float32)``.
  """
  batch, width = validate_step(a, b, state, reset)
  h = initial(state, (batch, width))
  if reset is not None:
    h = jnp.where(jnp.asarray(reset)[:, None], 0.0, h)
  h = jnp.asarray(a, jnp.float32) * h + jnp.asarray(b, jnp.float32)
  return h.astype(b.dtype), h
