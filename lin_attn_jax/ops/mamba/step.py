"""One selective-scan (Mamba) decoding step."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.mamba.inputs import (finish, grouped, grouped_projection,
                                           time_step, validate_step)


def selective_scan_step(u, delta, A, B, C, state=None, *, D=None, z=None,
                        delta_bias=None, delta_softplus=False, reset=None):
  """One decoding step, O(1) in the context length.

  Args:
    u, delta: ``[B, D]``; A: ``[D, N]``; B, C: ``[B, N]`` or ``[B, G, N]``.
    state: ``[B, D, N]`` float32, or None for zeros.
    D, z, delta_bias, delta_softplus: as in ``chunk_selective_scan`` (z is
      ``[B, D]``).
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(y [B, D] in u's dtype, new state [B, D, N] float32)``.
  """
  dims = validate_step(u, delta, A, B, C, D, z, delta_bias, state, reset)
  g, s = dims.groups, dims.state
  h = initial(state, (dims.batch, dims.width, s)).reshape(dims.batch, g, -1, s)
  if reset is not None:
    h = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, h)
  dt = grouped(time_step(delta, delta_bias, delta_softplus), g)  # [B, G, R]
  a_log = jnp.asarray(A, jnp.float32).reshape(g, -1, s)          # [G, R, N]
  b_proj = grouped_projection(B, 1)                              # [B, G, N]
  c_proj = grouped_projection(C, 1)
  h = (jnp.exp(dt[..., None] * a_log) * h
       + (dt * grouped(u, g))[..., None] * b_proj[:, :, None, :])
  y = jnp.einsum("bgrn,bgn->bgr", h, c_proj).reshape(dims.batch, dims.width)
  y = finish(y, u, D, z)
  return y.astype(u.dtype), h.reshape(dims.batch, dims.width, s)
