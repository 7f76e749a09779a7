"""S4D as one associative scan over time."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.diagonal_ssm.scan import (associative_linear_scan,
                                                keep_flags)
from lin_attn_jax.ops.s4d.complex_state import (discretize, read_out,
                                                to_complex, to_pair)
from lin_attn_jax.ops.s4d.inputs import validate

_F32 = jnp.float32


def parallel_s4d(u, log_dt, A_real, A_imag, B, C, *, D=None,
                 initial_state=None, output_final_state=False,
                 segment_ids=None):
  """One associative scan over the ``[B, T, D, N]`` complex states."""
  batch, length, channels, n_modes = validate(
      u, log_dt, A_real, A_imag, B, C, D, initial_state, segment_ids)
  dt_a, b_bar = discretize(log_dt, A_real, A_imag, B)
  keep = keep_flags(segment_ids, batch, length)[..., None, None]  # [B,T,1,1]
  a = jnp.exp(dt_a) * keep                                       # [B,T,D,N]
  b = b_bar * jnp.asarray(u, _F32)[..., None]                    # [B,T,D,N]
  h0 = None if initial_state is None else to_complex(initial_state)
  x = associative_linear_scan(a, b, h0)
  y = read_out(x, C, u, D)
  return y.astype(u.dtype), (to_pair(x[:, -1]) if output_final_state else None)
