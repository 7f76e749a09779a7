"""One S4D decoding step."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.s4d.complex_state import (complex_state, discretize,
                                                read_out, to_pair)
from lin_attn_jax.ops.s4d.inputs import check_params

_F32 = jnp.float32


def s4d_step(u, log_dt, A_real, A_imag, B, C, state=None, *, D=None,
             reset=None):
  """One decoding step: ``u: [B, D]``, state ``[B, D, N, 2]`` float32.

  Returns ``(y [B, D] in u's dtype, new state)``.
  """
  checks.check_rank("u", u, 2, "[B, D]")
  checks.check_float("u", u)
  batch, channels = checks.shape_of(u)
  n_modes = check_params(channels, log_dt, A_real, A_imag, B, C, D)
  checks.check_state("state", state, (batch, channels, n_modes, 2),
                     "[B, D, N, 2]")
  checks.check_reset(reset, batch)
  dt_a, b_bar = discretize(log_dt, A_real, A_imag, B)
  x = complex_state(state, (batch, channels, n_modes))
  if reset is not None:
    x = jnp.where(jnp.asarray(reset)[:, None, None], 0.0, x)
  x = jnp.exp(dt_a) * x + b_bar * jnp.asarray(u, _F32)[..., None]
  return read_out(x, C, u, D).astype(u.dtype), to_pair(x)
