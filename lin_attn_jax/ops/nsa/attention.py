"""The compressed and selected branches for a run of queries, blockwise.

Every fast form (the sequence, a cache, a device's share of a split
sequence) keeps the same three things: a *store* of keys and values indexed
by absolute position, the compressed blocks (``[B, N, Hkv, *]`` means and
the last position of each, ``-1`` for an empty slot, in position order),
and, per query, its position and the start of its document. Queries then
go in chunks of ``C``; for each chunk:

1. compressed: scores against all ``N`` compressed blocks, ``[B, Hkv, G,
   C, N]``, masked to the complete blocks of the query's document that end
   at or before it;
2. ranking: the probabilities summed over the ``G`` query heads of each
   key/value head, over the complete blocks before the query's own; the
   first and previous blocks of the document forced (``+inf``), then the
   current block appended last, also forced; ``lax.top_k`` of ``n`` picks
   the blocks (equal keys go to the lower index, i.e. the earlier block:
   slots are in position order);
3. selected: the ``n l`` tokens of the chosen blocks gathered from the
   store per key/value head, ``[B, C, n l, Hkv, K]``, and one softmax over
   them per query, masked to the tokens at or before it (every chosen
   block is whole in the store, so the softmax needs no streaming).

Cost per chunk: ``C N (H K + H V)`` for the compressed branch, ``C n l
(Hkv K + Hkv V + H K + H V)`` for the gather and the selected branch. The
chunks run under ``lax.map`` with each chunk rematerialised, so the
forward and the backward keep one chunk's scores and gathers alive beside
the ``O(T)`` store.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import GROUP_FLOATS
from lin_attn_jax.ops.nsa import blocks

_F32 = jnp.float32


def chunk_length(t: int, heads: int, heads_kv: int, dk: int, dv: int, *,
                 block_size: int, block_counts: int) -> int:
  """Queries per chunk by default: as many as keep the selected branch's
  gathered keys, values and scores near ``GROUP_FLOATS`` floats (at least
  one query, at most the sequence)."""
  per_query = block_counts * block_size * (heads_kv * (dk + dv) + heads)
  return max(1, min(t, GROUP_FLOATS // per_query))


def compressed_and_selected(q, q_pos, q_doc_start, k_store, v_store, k_cmp,
                            v_cmp, block_end, *, block_size: int,
                            block_counts: int, scale):
  """Steps 1-3 of the module docstring for one chunk of queries.

  Args:
    q: ``[B, C, H, K]`` float32.
    q_pos, q_doc_start: ``[B, C]`` int32: each query's position and the
      position where its document starts.
    k_store, v_store: ``[B, S, Hkv, *]``, the keys and values of position
      ``s`` at index ``s`` (any float dtype).
    k_cmp, v_cmp: ``[B, N, Hkv, *]`` float32 block means.
    block_end: ``[B, N]`` int32 last position of each block, ``-1`` empty.
  Returns:
    ``(o_cmp, o_slc)``, each ``[B, C, H, V]`` float32.
  """
  b, c, h, dk = q.shape
  size, hkv, dv = k_store.shape[1], k_store.shape[2], v_store.shape[-1]
  n, l = block_end.shape[1], block_size
  qg = scale * q.reshape(b, c, hkv, h // hkv, dk)           # [B, C, Hkv, G, K]
  within = q_pos - q_doc_start                              # [B, C]
  current = q_pos - within % l                              # [B, C]

  # 1. Compressed: complete blocks of the query's document, ended by now.
  end = block_end[:, None, :]                               # [B, 1, N]
  start = end - (l - 1)
  visible = ((end >= 0) & (end <= q_pos[..., None])
             & (start >= q_doc_start[..., None]))           # [B, C, N]
  if n:
    s = jnp.einsum("bchgk,bnhk->bhgcn", qg, k_cmp,
                   preferred_element_type=_F32)             # [B, Hkv, G, C, N]
    p = blocks.masked_softmax(s, visible[:, None, None])
    o_cmp = jnp.einsum("bhgcn,bnhv->bchgv", p, v_cmp,
                       preferred_element_type=_F32)         # [B, C, Hkv, G, V]
    importance = jnp.sum(jax.lax.stop_gradient(p), axis=2)  # [B, Hkv, C, N]
  else:
    o_cmp = jnp.zeros((b, c, hkv, h // hkv, dv), _F32)
    importance = jnp.zeros((b, hkv, c, 0), _F32)

  # 2. Ranking: blocks before the current one, the first and the previous
  # forced; then the current block (slot N), forced.
  earlier = visible & (end < current[..., None])            # [B, C, N]
  forced = earlier & ((start == q_doc_start[..., None])
                      | (end == current[..., None] - 1))
  rank_key = jnp.where(forced[:, None], jnp.inf,
                       jnp.where(earlier[:, None], importance, -jnp.inf))
  rank_key = jnp.concatenate(
      [rank_key, jnp.full((b, hkv, c, 1), jnp.inf)],
      axis=-1)                                              # [B, Hkv, C, N+1]
  count = min(block_counts, n + 1)
  top_key, top = jax.lax.top_k(rank_key, count)             # [B, Hkv, C, n]
  starts = jnp.concatenate(
      [jnp.broadcast_to(start, (b, c, n)), current[..., None]],
      axis=-1)                                              # [B, C, N+1]
  chosen_start = jnp.take_along_axis(
      jnp.broadcast_to(starts[:, None], (b, hkv, c, n + 1)), top,
      axis=-1)                                              # [B, Hkv, C, n]

  # 3. Selected: the chosen blocks' tokens, at or before the query.
  tokens = chosen_start[..., None] + jnp.arange(l, dtype=jnp.int32)
  allowed = ((top_key > -jnp.inf)[..., None]
             & (tokens <= q_pos[:, None, :, None, None]))   # [B, Hkv, C, n, l]
  # One gather per store, in its own layout: token index per head.
  index = jnp.moveaxis(jnp.clip(tokens, 0, size - 1), 1, -1).reshape(
      b, c * count * l, hkv, 1)                             # [B, C n l, Hkv, 1]
  keys, values = (
      jnp.take_along_axis(x, index, axis=1).astype(_F32).reshape(
          b, c, count * l, hkv, x.shape[-1])
      for x in (k_store, v_store))                          # [B,C,n l,Hkv,*]
  s = jnp.einsum("bchgk,bcjhk->bhgcj", qg, keys,
                 preferred_element_type=_F32)               # [B,Hkv,G,C,n l]
  p = blocks.masked_softmax(
      s, allowed.reshape(b, hkv, 1, c, count * l))
  o_slc = jnp.einsum("bhgcj,bcjhv->bchgv", p, values,
                     preferred_element_type=_F32)           # [B, C, Hkv, G, V]
  return o_cmp.reshape(b, c, h, dv), o_slc.reshape(b, c, h, dv)


def over_chunks(q, q_pos, q_doc_start, k_store, v_store, k_cmp, v_cmp,
                block_end, *, chunk: int, **options):
  """``compressed_and_selected`` over chunks of ``chunk`` queries.

  Args:
    q: ``[B, T, H, K]`` float32; q_pos, q_doc_start: ``[B, T]``;
    k_store, v_store: ``[B, S, Hkv, *]`` indexed by position; the rest and
      ``options`` as in ``compressed_and_selected``.
  Returns:
    ``(o_cmp, o_slc)``, each ``[B, T, H, V]`` float32.
  """
  def one_chunk(xs):
    return compressed_and_selected(*xs, k_store, v_store, k_cmp, v_cmp,
                                   block_end, **options)

  b, t = q.shape[:2]
  if t <= chunk:
    return one_chunk((q, q_pos, q_doc_start))
  steps = -(-t // chunk)

  def to_chunks(x):                          # [B, T, ...] -> [N, B, C, ...]
    x = jnp.pad(x, [(0, 0), (0, steps * chunk - t)] + [(0, 0)] * (x.ndim - 2),
                mode="edge")
    x = x.reshape((b, steps, chunk) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0)

  outs = jax.lax.map(jax.checkpoint(one_chunk),
                     tuple(to_chunks(x) for x in (q, q_pos, q_doc_start)))
  return tuple(jnp.moveaxis(o, 0, 1).reshape((b, steps * chunk) + o.shape[3:])
               [:, :t] for o in outs)


def sequence_blocks(k, v, segment_ids, *, block_size: int):
  """The complete blocks of a whole sequence.

  Args:
    k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``; segment_ids: ``[B, T]``
      or None.
  Returns:
    ``(doc_start [B, T], k_cmp [B, N, Hkv, K], v_cmp [B, N, Hkv, V],
    block_end [B, N])``, ``N = T // block_size``.
  """
  b, t = k.shape[:2]
  l, n = block_size, t // block_size
  pos = jnp.arange(t, dtype=jnp.int32)
  doc_start = blocks.document_start(segment_ids, b, t)      # [B, T]
  if segment_ids is None:
    block_end = jnp.broadcast_to(pos[l - 1:n * l:l], (b, n))
    k_cmp, v_cmp = (jnp.mean(jnp.asarray(x[:, :n * l], _F32).reshape(
        (b, n, l) + x.shape[2:]), axis=2) for x in (k, v))  # [B, N, Hkv, *]
    return doc_start, k_cmp, v_cmp, block_end
  block_end = blocks.compact_ends(
      blocks.is_block_end(pos, doc_start, l), jnp.broadcast_to(pos, (b, t)),
      n)                                                    # [B, N]
  k_cmp, v_cmp = (blocks.pool_blocks(x, block_end, l) for x in (k, v))
  return doc_start, k_cmp, v_cmp, block_end


def sparse_branches(q, k, v, segment_ids, *, block_size, block_counts, scale,
                    chunk_size, positions=None, doc_start=None):
  """The compressed and selected branches of queries ``q [B, Tq, H, K]``
  against the whole sequence ``k, v [B, T, Hkv, *]`` (``Tq = T`` unless
  ``positions`` and ``doc_start`` ``[B, Tq]`` say where the queries sit).
  Returns ``(o_cmp, o_slc)``, ``[B, Tq, H, V]`` float32."""
  b, tq, h, dk = q.shape
  hkv, dv = k.shape[2], v.shape[-1]
  starts, k_cmp, v_cmp, block_end = sequence_blocks(
      k, v, segment_ids, block_size=block_size)
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(tq, dtype=jnp.int32), (b, tq))
    doc_start = starts
  chunk = (chunk_length(tq, h, hkv, dk, dv, block_size=block_size,
                        block_counts=block_counts)
           if chunk_size is None else chunk_size)
  return over_chunks(
      jnp.asarray(q, _F32), positions, doc_start, k, v, k_cmp, v_cmp,
      block_end, chunk=chunk, block_size=block_size,
      block_counts=block_counts, scale=scale)
