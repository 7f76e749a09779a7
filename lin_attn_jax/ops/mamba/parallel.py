"""The selective scan as one associative scan over ``[B, T, D, N]``.

It holds the whole ``[B, T, D, N]`` state sequence (several times, in the
backward pass): simple and log-depth, but for long sequences use the chunk
form.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.diagonal_ssm.parallel import (parallel_noncausal_scan,
                                                   parallel_scan_f32)
from lin_attn_jax.ops.diagonal_ssm.scan import keep_flags
from lin_attn_jax.ops.mamba.bidirectional import noncausal_selective_scan
from lin_attn_jax.ops.mamba.inputs import (finish, grouped, grouped_projection,
                                           time_step, validate)


def parallel_selective_scan(u, delta, A, B, C, *, D=None, z=None,
                            delta_bias=None, delta_softplus=False,
                            initial_state=None, output_final_state=False,
                            segment_ids=None, causal=True):
  """Shapes as in ``chunk_selective_scan``."""
  dims = validate(u, delta, A, B, C, D, z, delta_bias, initial_state,
                  segment_ids)
  check_no_state("parallel_selective_scan", causal, initial_state,
                 output_final_state)
  if not causal:
    return noncausal_selective_scan(
        parallel_noncausal_scan, u, delta, A, B, C, D=D, z=z,
        delta_bias=delta_bias, delta_softplus=delta_softplus,
        segment_ids=segment_ids, dims=dims)
  batch, length = u.shape[:2]
  g, s = dims.groups, dims.state
  dt = grouped(time_step(delta, delta_bias, delta_softplus), g)  # [B,T,G,R]
  a_log = jnp.asarray(A, jnp.float32).reshape(g, -1, s)          # [G, R, N]
  b_proj = grouped_projection(B, 2)                              # [B,T,G,N]
  c_proj = grouped_projection(C, 2)                              # [B,T,G,N]
  a = jnp.exp(dt[..., None] * a_log)                             # [B,T,G,R,N]
  b = (dt * grouped(u, g))[..., None] * b_proj[:, :, :, None]    # [B,T,G,R,N]
  h0 = None
  if initial_state is not None:
    h0 = jnp.asarray(initial_state, jnp.float32).reshape(batch, g, -1, s)
  h, final = parallel_scan_f32(a, b, keep_flags(segment_ids, batch, length),
                               h0)
  y = jnp.einsum("btgrn,btgn->btgr", h, c_proj)                  # [B,T,G,R]
  y = finish(y.reshape(batch, length, dims.width), u, D, z)
  final = final.reshape(batch, dims.width, s) if output_final_state else None
  return y.astype(u.dtype), final
