"""The quadratic form: ``[T, T]`` decay-weighted scores, masked, times v.

    o_i = sum_{j <= i, same document} (q_i . (exp(G_i - G_j) * k_j)) v_j
          + [no reset in 1..i] (q_i * exp(G_i)) . S_0

with ``G_i - G_j = sum_{m=j+1}^{i} g_m`` summed exactly (``segsum``), never as
a difference of two long prefix sums. With a decay per key channel the scores
are built one block of query rows at a time (rematerialised in the backward
pass), so memory stays ``O(T^2 + r^2 K)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.decay import (pairwise_sums,
                                           reverse_exclusive_cumsum, segsum)
from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.gated_linear.bidirectional import (gate_as_given,
                                                   lion_outputs)
from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate

_ROW_BLOCK = 32


def _channel_decay_scores(q, k, g, mask):
  """Scores ``[B, H, T, T]`` for a per-channel log-decay ``g: [B, T, H, K]``.

  Query rows are taken in blocks of ``_ROW_BLOCK`` starting at ``s``. For a
  key j before the block the decay factors into ``exp(L_i)`` (gates from s
  to i) times ``exp(R_j)`` (gates strictly between j and s), both <= 1, so
  those scores are one matmul; keys inside the block use ``exp(sum_{j<m<=i} g_m)``
  (``pairwise_sums``, ``[r, r, K]``), 1 on the diagonal.
  """
  b, t, h, dk = q.shape
  rows = _ROW_BLOCK
  padded = -(-t // rows) * rows
  q_p, k_p, g_p = (pad_time(x, rows) for x in (q, k, g))
  mask_p = jnp.pad(mask, ((0, 0), (0, 0), (0, padded - t), (0, padded - t)))
  positions = jnp.arange(padded)
  strict = jnp.tril(jnp.ones((rows, rows), dtype=bool), -1)[:, :, None, None]

  @jax.checkpoint
  def block_scores(start):
    take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, rows, 1)
    q_r, k_r, g_r = take(q_p), take(k_p), take(g_p)            # [B, r, H, K]
    local = jnp.cumsum(g_r, axis=1)                            # [B, r, H, K]
    before = jnp.where((positions < start)[None, :, None, None], g_p, 0.0)
    to_start = reverse_exclusive_cumsum(before, axis=1)        # [B, T, H, K]
    earlier = jnp.where((positions < start)[None, :, None, None],
                        k_p * jnp.exp(to_start), 0.0)
    scores = jnp.einsum("bihk,bjhk->bhij", q_r * jnp.exp(local), earlier)
    diff = pairwise_sums(g_r, axis=1)                          # [B, r, r, H, K]
    decay = (jnp.exp(jnp.where(strict, diff, -jnp.inf))
             + jnp.eye(rows, dtype=jnp.float32)[:, :, None, None])
    inside = jnp.einsum("bihk,bjhk,bijhk->bhij", q_r, k_r, decay)
    scores = jax.lax.dynamic_update_slice_in_dim(
        scores, inside + jax.lax.dynamic_slice_in_dim(scores, start, rows, 3),
        start, 3)
    return scores                                              # [B, H, r, T]

  starts = jnp.arange(padded // rows) * rows
  scores = jax.lax.map(block_scores, starts)                   # [R, B, H, r, T]
  scores = jnp.moveaxis(scores, 0, 2).reshape(b, h, padded, padded)
  return jnp.where(mask_p, scores, 0.0)[:, :, :t, :t]


def parallel_gated_linear(q, k, v, g=None, *, scale=None, initial_state=None,
                          output_final_state=False, segment_ids=None,
                          causal=True):
  """Quadratic masked form. Shapes as in ``chunk_gated_linear``; with
  ``causal=False`` the causal form forward and on the reversed sequence
  (``bidirectional.py``)."""
  b, t, h, dk, dv, g = validate(q, k, v, g, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  check_no_state("parallel_gated_linear", causal, initial_state,
                 output_final_state)
  if not causal:
    return lion_outputs(parallel_gated_linear, q, k, v, gate_as_given(g),
                        scale=scale,
                        segment_ids=segment_ids).astype(v.dtype), None
  qf = scale * jnp.asarray(q, jnp.float32)
  kf = jnp.asarray(k, jnp.float32)
  vf = jnp.asarray(v, jnp.float32)
  doc = document_index(segment_ids, b, t)                       # [B, T]
  causal = jnp.tril(jnp.ones((t, t), dtype=bool))
  mask = causal & same_document_mask(doc, doc)[:, None]         # [B, 1, T, T]
  if g is None:
    g = jnp.zeros((b, t, h, 1), jnp.float32)
  if g.shape[-1] == 1:
    log_decay = segsum(g[..., 0], axis=1)                       # [B, H, T, T]
    log_decay = jnp.where(mask, log_decay, -jnp.inf)
    scores = jnp.einsum("bihk,bjhk->bhij", qf, kf) * jnp.exp(log_decay)
  else:
    scores = _channel_decay_scores(qf, kf, g, jnp.broadcast_to(mask,
                                                               (b, h, t, t)))
  o = jnp.einsum("bhij,bjhv->bihv", scores, vf)                 # [B, T, H, V]
  decay_from_start = jnp.cumsum(g, axis=1)                      # [B, T, H, G]
  first_doc = (doc == 0)[:, :, None, None]                      # [B, T, 1, 1]
  if initial_state is not None:
    s0 = jnp.asarray(initial_state, jnp.float32)
    q_from_start = jnp.where(first_doc, qf * jnp.exp(decay_from_start), 0.0)
    o = o + jnp.einsum("bihk,bhkv->bihv", q_from_start, s0)
  final_state = None
  if output_final_state:
    # Decay from j to the end: the last row of the pairwise sums.
    last_doc = doc[:, -1:]                                      # [B, 1]
    to_end = reverse_exclusive_cumsum(g, axis=1)                # [B, T, H, G]
    to_end = jnp.where((doc == last_doc)[:, :, None, None], to_end, -jnp.inf)
    final_state = jnp.einsum("bjhk,bjhv->bhkv", kf * jnp.exp(to_end), vf)
    if initial_state is not None:
      keep = (last_doc[:, 0] == 0)[:, None, None, None]
      total = jnp.exp(decay_from_start[:, -1])[..., None]       # [B, H, G, 1]
      final_state = final_state + jnp.where(keep, total * s0, 0.0)
  return o.astype(v.dtype), final_state
