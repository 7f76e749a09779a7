"""The definition of log-linear attention: a Fenwick tree of states.

Log-linear attention (Guo et al. 2025, https://arxiv.org/abs/2506.04761)
keeps ``L`` gated-linear states per head, the buckets of a Fenwick tree
over the positions; the output weighs each bucket's read with its own
``lambda_t^(l)``. Per head, for the token at position ``p`` of its
document:

    m = merge_level(p)           the carry of the binary counter p - 1 -> p
    S_m <- S_0 + ... + S_m;  S_0 .. S_{m-1} <- 0
    S_l <- exp(g_t) S_l          every level
    S_0 <- S_0 + k_t v_t^T
    o_t = scale * sum_l lambda_t^(l) S_l^T q_t

so that ``S_l`` holds the tokens of level ``l`` seen from ``t``
(``inputs.py``): ``o_t = scale * sum_s exp(g_{s+1} + ... + g_t)
lambda_t^(level(t,s)) (q_t . k_s) v_s``, fla's ``naive_log_linear_attn``
with the level masks of ``construct_level_mask``. The top level ``L - 1``
holds every bucket from it up: with ``L >= ceil(log2 T) + 1`` no bucket is
merged. A document's first token merges everything into the top level (a
state is zeroed at a document start, so only ``initial_state`` can be
there).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.log_linear_attn.inputs import (default_scale,
                                                    merge_level, positions,
                                                    validate)

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_log_linear_attn(q, k, v, g, level_scales, *, scale=None,
                                    initial_state=None,
                                    output_final_state=False,
                                    segment_ids=None, offset=0):
  """Reference recurrence.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: ``[B, T, H]`` natural-log decays ``<= 0`` (Mamba-2's ``dt A``).
    level_scales: ``[B, T, H, L]``, ``lambda_t^(l)``; ``L``, the number of
      levels, is the size of the state's level axis.
    scale: query scale, ``K ** -0.5`` when None.
    initial_state: ``[B, H, L, K, V]`` float32 level states, or None.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes and
      positions restart at 0.
    offset: int or ``[B]`` int, the position of the first token in its
      document (the tokens before it are in ``initial_state``).
  Returns:
    ``(o [B, T, H, V] in v's dtype, final state [B, H, L, K, V] float32 or
    None)``.
  """
  b, t, h, dk, dv, levels = validate(q, k, v, g, level_scales, initial_state,
                                     segment_ids, offset)
  scale = default_scale(scale, dk)
  state = (jnp.zeros((b, h, levels, dk, dv), jnp.float32)
           if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  reset = reset_flags(segment_ids, b, t)
  merge = merge_level(positions(segment_ids, offset, b, t), levels)
  level = jnp.arange(levels)

  def token(state, inputs):
    q_t, k_t, v_t, g_t, lam_t, m_t, reset_t = inputs       # [B, H, K], [B]
    state = jnp.where(reset_t[:, None, None, None, None], 0.0, state)
    merged = level[None] <= m_t[:, None]                    # [B, L]
    total = jnp.sum(jnp.where(merged[:, None, :, None, None], state, 0.0),
                    axis=2)                                 # [B, H, K, V]
    top = (level[None] == m_t[:, None])[:, None, :, None, None]
    state = jnp.where(top, total[:, :, None],
                      jnp.where(merged[:, None, :, None, None], 0.0, state))
    state = jnp.exp(g_t)[..., None, None, None] * state
    state = state.at[:, :, 0].add(k_t[..., :, None] * v_t[..., None, :])
    o_t = jnp.einsum("bhk,bhl,bhlkv->bhv", scale * q_t, lam_t, state,
                     precision=_HIGHEST)
    return state, o_t

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0)
                for x in (q, k, v, g, level_scales)]
  state, o = jax.lax.scan(token, state, (*time_major, merge.T, reset.T))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)                 # [B, T, H, V]
  return o, (state if output_final_state else None)
