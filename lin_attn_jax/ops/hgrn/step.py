"""One HGRN decoding step."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.diagonal_ssm.inputs import check_step, initial

_F32 = jnp.float32


def hgrn_step(x, g, state=None, *, reset=None):
  """One decoding step: ``[B, D]`` inputs, ``[B, D]`` float32 state.

  Returns ``(h_t [B, D] in x's dtype, h_t float32)``.
  """
  batch, width = check_step(("x", "g"), (x, g))
  checks.check_nonpositive("g", g)
  checks.check_state("state", state, (batch, width), "[B, D]")
  checks.check_reset(reset, batch)
  h = initial(state, (batch, width))
  if reset is not None:
    h = jnp.where(jnp.asarray(reset)[:, None], 0.0, h)
  h = jnp.exp(jnp.asarray(g, _F32)) * h + jnp.asarray(x, _F32)
  return h.astype(x.dtype), h
