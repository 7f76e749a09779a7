"""The shift SSM as one causal convolution."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.conv.convolutions import initial_window, shifted_sum_conv
from lin_attn_jax.ops.shift_ssm.inputs import validate
from lin_attn_jax.ops.shift_ssm.taps import skip, taps_oldest_first

_F32 = jnp.float32


def parallel_shift_ssm(u, C, *, D=None, initial_state=None,
                       output_final_state=False, segment_ids=None):
  """``parallel_causal_conv1d`` with the taps of ``C``. Shapes as below."""
  batch, length, channels, n_state = validate(u, C, D, initial_state,
                                              segment_ids)
  window0 = initial_window(initial_state, batch, n_state, channels)
  y, final = shifted_sum_conv(jnp.asarray(u, _F32), taps_oldest_first(C),
                              window0,
                              document_index(segment_ids, batch, length),
                              output_final_state)
  return skip(y, u, D).astype(u.dtype), final
