"""The token-by-token form: ``hgrn_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.hgrn.inputs import validate
from lin_attn_jax.ops.hgrn.step import hgrn_step


def recurrent_hgrn(x, g, *, initial_state=None, output_final_state=False,
                   segment_ids=None):
  """``hgrn_step`` scanned over time. Shapes as in ``chunk_hgrn``."""
  batch, length, width = validate(x, g, initial_state, segment_ids)

  def step(h, inputs):
    x_t, g_t, reset_t = inputs
    out, h = hgrn_step(x_t, g_t, h, reset=reset_t)
    return h, out

  xs = [jnp.moveaxis(v, 1, 0) for v in (x, g)]
  state, h = jax.lax.scan(step, initial(initial_state, (batch, width)),
                          (*xs, reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(h, 0, 1), (state if output_final_state else None)
