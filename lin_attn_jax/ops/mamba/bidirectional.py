"""Mamba's selective scan without the causal mask (``causal=False`` on its
sequence forms): the non-causal linear scan (LION,
``diagonal_ssm/bidirectional.py``) of its coefficients ``a = exp(dt A)`` and
``b = dt u B``, read by ``C`` and finished by ``D u`` and ``silu(z)`` as the
causal scan is:

    y_i = C_i . sum_{j in i's document} M_ij b_j,
    M_ij = prod of exp(dt_m A) for m strictly after the earlier of i, j up
           to the later one.

The decay and the input of a token share ``dt``, so the backward scan (the
decays one token earlier, the inputs in place) cannot be the fused causal
scan of ``chunk.py``: every form runs the linear scan on the coefficients,
``[B, T, D, N]`` float32 (memory ``T D N``, as the parallel form's).
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from lin_attn_jax.ops.diagonal_ssm.bidirectional import (lion_definition,
                                                         lion_scan)
from lin_attn_jax.ops.mamba.inputs import (finish, grouped,
                                           grouped_projection, time_step)

_F32 = jnp.float32


def noncausal_selective_scan(scan: Callable | None, u, delta, A, B, C, *,
                             D, z, delta_bias, delta_softplus, segment_ids,
                             dims):
  """``(y [B, T, D] in u's dtype, None)``.

  Args:
    scan: ``scan(a, b, segment_ids) -> h``, a causal scan of float32
      ``[B, T, F]`` coefficients from zero, run both ways; None for the
      dense definition.
    u, delta, A, B, C, D, z, delta_bias, delta_softplus, segment_ids: as in
      ``chunk_selective_scan`` (validated by the caller, ``dims`` its
      result).
  """
  batch, length = u.shape[:2]
  g, s = dims.groups, dims.state
  dt = grouped(time_step(delta, delta_bias, delta_softplus), g)  # [B,T,G,R]
  a_log = jnp.asarray(A, _F32).reshape(g, -1, s)                 # [G, R, N]
  b_proj = grouped_projection(B, 2)                              # [B,T,G,N]
  c_proj = grouped_projection(C, 2)                              # [B,T,G,N]
  a = jnp.exp(dt[..., None] * a_log)                             # [B,T,G,R,N]
  b = (dt * grouped(u, g))[..., None] * b_proj[:, :, :, None]    # [B,T,G,R,N]
  flat_a, flat_b = (x.reshape(batch, length, -1) for x in (a, b))
  h = (lion_definition(flat_a, flat_b, segment_ids) if scan is None
       else lion_scan(scan, flat_a, flat_b, segment_ids)).reshape(a.shape)
  y = jnp.einsum("btgrn,btgn->btgr", h, c_proj)                  # [B,T,G,R]
  y = finish(y.reshape(batch, length, dims.width), u, D, z)
  return y.astype(u.dtype), None
