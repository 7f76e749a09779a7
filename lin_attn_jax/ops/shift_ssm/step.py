"""One shift-SSM decoding step."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.conv.convolutions import conv_step, initial_window
from lin_attn_jax.ops.diagonal_ssm.inputs import check_vector
from lin_attn_jax.ops.shift_ssm.inputs import check_C
from lin_attn_jax.ops.shift_ssm.taps import skip, taps_oldest_first

_F32 = jnp.float32


def shift_ssm_step(u, C, state=None, *, D=None, reset=None):
  """One decoding step: ``u: [B, D]``, state ``[B, N - 1, D]`` float32.

  Returns ``(y [B, D] in u's dtype, new state)``.
  """
  checks.check_rank("u", u, 2, "[B, D]")
  checks.check_float("u", u)
  batch, channels = checks.shape_of(u)
  n_state = check_C(C, channels, direct=True)
  check_vector("D", D, channels)
  checks.check_state("state", state, (batch, n_state - 1, channels),
                     "[B, N - 1, D]")
  checks.check_reset(reset, batch)
  y, window = conv_step(jnp.asarray(u, _F32), taps_oldest_first(C),
                        initial_window(state, batch, n_state, channels), reset)
  return skip(y, u, D).astype(u.dtype), window
