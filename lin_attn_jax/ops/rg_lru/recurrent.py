"""The token-by-token form: ``rg_lru_step`` scanned over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.diagonal_ssm.recurrent import recurrent_noncausal_scan
from lin_attn_jax.ops.rg_lru.bidirectional import noncausal_rg_lru
from lin_attn_jax.ops.rg_lru.inputs import validate
from lin_attn_jax.ops.rg_lru.step import rg_lru_step

_F32 = jnp.float32


def recurrent_rg_lru(x, a_gate, x_gate, a_param, *, c=8.0, initial_state=None,
                     output_final_state=False, segment_ids=None,
                     unscaled=None, causal=True):
  """``rg_lru_step`` scanned over time. Shapes as in ``chunk_rg_lru``."""
  batch, width = validate(x, a_gate, x_gate, a_param, initial_state,
                          segment_ids, step=False, unscaled=unscaled)
  check_no_state("recurrent_rg_lru", causal, initial_state, output_final_state)
  if not causal:
    return noncausal_rg_lru(recurrent_noncausal_scan, x, a_gate, x_gate,
                            a_param, c=c, segment_ids=segment_ids,
                            unscaled=unscaled)
  reset = reset_flags(segment_ids, batch, x.shape[1])
  unscaled = (jnp.zeros_like(reset) if unscaled is None
              else jnp.asarray(unscaled, bool))
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  a_param = jnp.asarray(a_param, _F32)

  def step(h, inputs):
    x_t, a_gate_t, x_gate_t, reset_t, unscaled_t = inputs
    out, h = rg_lru_step(x_t, a_gate_t, x_gate_t, a_param, h, c=c,
                         reset=reset_t, unscaled=unscaled_t)
    return h, out

  xs = [jnp.moveaxis(v, 1, 0) for v in (x, a_gate, x_gate)]
  state, h = jax.lax.scan(step, initial(initial_state, (batch, width)),
                          (*xs, reset.T, unscaled.T))
  return jnp.moveaxis(h, 0, 1), (state if output_final_state else None)
