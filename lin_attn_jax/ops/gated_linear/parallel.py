"""The quadratic form: ``[T, T]`` decay-weighted scores, masked, times v.

    o_i = sum_{j <= i, same document} (q_i . (exp(G_i - G_j) * k_j)) v_j
          + [no reset in 1..i] (q_i * exp(G_i)) . S_0

with ``G_i - G_j = sum_{m=j+1}^{i} g_m`` summed exactly (``segsum``), never as
a difference of two long prefix sums. With a decay per key channel the scores
need a ``[T, T, K]`` factor; it is built one block of query rows at a time
(rematerialised in the backward pass) so memory stays ``O(T^2 + R T K)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import pad_time, split_chunks
from lin_attn_jax.ops.common.decay import reverse_exclusive_cumsum, segsum
from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate

_ROW_BLOCK = 64


def _channel_decay_scores(q, k, g, mask):
  """Scores ``[B, H, T, T]`` for a per-channel log-decay ``g: [B, T, H, K]``.

  Query rows are taken in blocks of ``_ROW_BLOCK``; for each block the
  pairwise log-decays are rebased on the block's first row so that the
  entries near the diagonal are sums of few terms.
  """
  b, t, h, dk = q.shape
  rows = _ROW_BLOCK
  q_blocks = split_chunks(pad_time(q, rows), rows)            # [B, R, r, H, K]
  mask_blocks = split_chunks(pad_time(jnp.moveaxis(mask, -2, 1), rows), rows)
  positions = jnp.arange(t)

  @jax.checkpoint
  def block_scores(args):
    q_r, mask_r, start = args                     # [B, r, H, K], [B, r, H, T]
    # Log-decay from the block start to every position m, as a signed sum of
    # the gates strictly between them: P_i - P_j = sum_{j < m <= i} g_m.
    after = jnp.cumsum(jnp.where((positions > start)[None, :, None, None], g,
                                 0.0), axis=1)
    before = jnp.where((positions <= start)[None, :, None, None], g, 0.0)
    rebased = after - reverse_exclusive_cumsum(before, axis=1)  # [B, T, H, K]
    p_i = jax.lax.dynamic_slice_in_dim(
        jnp.pad(rebased, ((0, 0), (0, rows), (0, 0), (0, 0))), start, rows, 1)
    diff = p_i[:, :, None] - rebased[:, None, :]               # [B, r, T, H, K]
    diff = jnp.where(jnp.moveaxis(mask_r, -1, 2)[..., None], diff, -jnp.inf)
    return jnp.einsum("bihk,bjhk,bijhk->bhij", q_r, k, jnp.exp(diff))

  starts = jnp.arange(q_blocks.shape[1]) * rows
  scores = jax.lax.map(
      block_scores,
      (jnp.moveaxis(q_blocks, 1, 0), jnp.moveaxis(mask_blocks, 1, 0), starts))
  scores = jnp.moveaxis(scores, 0, 2)                          # [B, H, R, r, T]
  return scores.reshape(b, h, -1, t)[:, :, :t]


def parallel_gated_linear(q, k, v, g=None, *, scale=None, initial_state=None,
                          output_final_state=False, segment_ids=None):
  """Quadratic masked form. Shapes as in ``chunk_gated_linear``."""
  b, t, h, dk, dv, g = validate(q, k, v, g, initial_state, segment_ids)
  scale = default_scale(scale, dk)
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
