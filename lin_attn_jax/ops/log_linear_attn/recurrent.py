"""The token-by-token scan, on the block states ``F_l``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.log_linear_attn.inputs import (cumulative,
                                                    default_scale, fenwick,
                                                    positions, validate)

_F32 = jnp.float32


def recurrent_log_linear_attn(q, k, v, g, level_scales, *, scale=None,
                              initial_state=None, output_final_state=False,
                              segment_ids=None, offset=0):
  """Log-linear attention token by token, on the block states ``F_l =
  S_0 + ... + S_l`` (``inputs.block_terms``): ``F_l`` is a gated-linear
  state zeroed where a block of ``2^l`` positions starts (``p % 2^l ==
  0``, ``l < L - 1``) or a document does, and ``o_t = scale * sum_l
  (lambda_t^(l) - lambda_t^(l+1)) F_l^T q_t`` (``lambda^(L) = 0``). The
  state given and returned is the Fenwick levels'. Arguments as in
  ``naive_recurrent_log_linear_attn``."""
  b, t, h, dk, dv, levels = validate(q, k, v, g, level_scales, initial_state,
                                     segment_ids, offset)
  scale = default_scale(scale, dk)
  blocks = (jnp.zeros((b, h, levels, dk, dv), _F32) if initial_state is None
            else cumulative(initial_state))
  pos = positions(segment_ids, offset, b, t)                    # [B, T]
  sizes = jnp.left_shift(1, jnp.arange(levels, dtype=jnp.int32))
  starts = (pos[..., None] % sizes == 0) & (jnp.arange(levels) < levels - 1)
  starts = starts | reset_flags(segment_ids, b, t)[..., None]   # [B, T, L]
  lam = jnp.asarray(level_scales, _F32)
  weights = lam - jnp.concatenate([lam[..., 1:], jnp.zeros_like(lam[..., :1])],
                                  axis=-1)                      # [B, T, H, L]

  def token(blocks, inputs):
    q_t, k_t, v_t, g_t, w_t, start_t = inputs
    blocks = jnp.where(start_t[:, None, :, None, None], 0.0, blocks)
    blocks = jnp.einsum("bh,bhlkv->bhlkv", jnp.exp(g_t), blocks,
                        preferred_element_type=_F32)
    blocks = blocks + jnp.einsum("bhk,bhv->bhkv", k_t, v_t,
                                 preferred_element_type=_F32)[:, :, None]
    o_t = jnp.einsum("bhk,bhl,bhlkv->bhv", scale * q_t, w_t, blocks,
                     preferred_element_type=_F32)
    return blocks, o_t

  time_major = [jnp.moveaxis(jnp.asarray(x, _F32), 1, 0)
                for x in (q, k, v, g, weights)]
  blocks, o = jax.lax.scan(token, blocks,
                           (*time_major, jnp.moveaxis(starts, 1, 0)))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)                     # [B, T, H, V]
  return o, (fenwick(blocks) if output_final_state else None)
