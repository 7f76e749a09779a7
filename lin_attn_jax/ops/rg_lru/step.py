"""One RG-LRU decoding step."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.rg_lru.coefficients import rg_lru_coefficients
from lin_attn_jax.ops.rg_lru.inputs import validate


def rg_lru_step(x, a_gate, x_gate, a_param, state=None, *, c=8.0, reset=None,
                unscaled=None):
  """One decoding step: ``[B, D]`` inputs, ``[B, D]`` float32 state.

  Returns ``(h_t [B, D] in x's dtype, h_t float32)``.
  """
  batch, width = validate(x, a_gate, x_gate, a_param, state, reset, step=True,
                          unscaled=unscaled)
  h = initial(state, (batch, width))
  if reset is not None:
    h = jnp.where(jnp.asarray(reset)[:, None], 0.0, h)
  a, b = rg_lru_coefficients(x, a_gate, x_gate, a_param, c, unscaled)
  h = a * h + b
  return h.astype(x.dtype), h
