"""Blockwise MoBA: the training path; never forms ``[T, T]``.

Two passes over tiles of ``c = chunk_size`` queries, merged exactly through
their log-sum-exp (``softmax_attn.blocksparse.merge_passes``), since they
count disjoint keys of each query:

1. **Own block**: each query against the keys of its own block up to
   itself. That block starts at most ``C - 1`` positions before the query,
   so this is sliding-window attention with window ``C`` under one more
   mask, "same block start" (blocks, like documents, are compared by an id:
   their first position). The block-sparse online softmax of the softmax
   family runs it (``blocksparse_attention``, over the key tiles that hold
   a query tile and the ``C - 1`` positions before it): ``O(T (C + c) (K
   + V))`` work per head.
2. **Selected blocks**: the means of the ``NF <= T / C`` full blocks
   (``blocks.full_blocks``), the ``top_k - 1`` gates per query, one tile
   at a time (``selection.select_blocks``, ``O(T NF K)`` work per head),
   then each tile against the union of the blocks its queries selected
   (``union.selected_block_attention``): between ``(top_k - 1) T C (K +
   V)`` and ``min(NF, c (top_k - 1)) T C (K + V)`` work per head, as the
   selections of a tile's queries agree or not (on random inputs they do
   not, and this is the work of causal attention:
   benchmarks/RESULTS_softmax.md).

Both passes keep only outputs and log-sum-exps for their backward and
recompute the rest, so memory is ``O(T)`` in both directions (plus the
``O(c T / C)`` gates of one tile). ``chunk_size`` changes speed, never
results beyond float tolerance; ``block_size`` is MoBA's block, part of the
model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common import context_parallel
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.moba import blocks
from lin_attn_jax.ops.moba import context_parallel as split
from lin_attn_jax.ops.moba.inputs import validate
from lin_attn_jax.ops.moba.selection import select_blocks
from lin_attn_jax.ops.moba.union import selected_block_attention
from lin_attn_jax.ops.softmax_attn.blocksparse import (blocksparse_attention,
                                                       merge_passes)
from lin_attn_jax.ops.softmax_attn.chunk import (chunk_softmax_attn,
                                                 padded_positions)
from lin_attn_jax.ops.softmax_attn.inputs import default_scale

_F32 = jnp.float32


def _own_block(q, k_win, v_win, q_start, win_start, *, halo: int,
               block_size: int, chunk: int, scale: float):
  """Pass 1 on a window of keys.

  Args:
    q: ``[B, Tq, H, K]``; its queries sit at window positions ``halo ..
      halo + Tq - 1``.
    k_win, v_win: ``[B, halo + Tq, Hkv, *]`` the keys of the ``halo``
      positions before the queries and of the queries'.
    q_start, win_start: ``[B, Tq]`` and ``[B, halo + Tq]`` block starts
      (-1 where there is no key).
  Returns:
    ``(o [B, Rq, H, V], lse [B, Rq, H])``, rows padded to ``chunk``.
  """
  tq, c = q.shape[1], chunk
  keys = halo + tq
  q_pos = padded_positions(np.arange(tq) + halo, c)             # [Rq]
  k_pos = padded_positions(np.arange(keys), c)                  # [Rk]
  pairs = [], []
  for n in range(q_pos.size // c):
    lo = max(0, n * c + halo - (block_size - 1))
    hi = min(n * c + c - 1 + halo, keys - 1)
    for key_tile in range(lo // c, hi // c + 1):
      pairs[0].append(n)
      pairs[1].append(key_tile)

  def rule(i, j, rule_id):
    del rule_id
    return (j <= i) & (i - j < block_size)

  return blocksparse_attention(
      pad_time(jnp.asarray(q, _F32), c), pad_time(jnp.asarray(k_win, _F32), c),
      pad_time(jnp.asarray(v_win, _F32), c),
      pad_time(q_start, c, mode="edge"), pad_time(win_start, c, mode="edge"),
      q_pos=q_pos, k_pos=k_pos, pairs=pairs + ([0] * len(pairs[0]),),
      rule=rule, block_size=c, scale=scale)


def blockwise_moba(q, k, v, doc, *, q_offset, halo: int, block_size: int,
                   top_k: int, scale: float, chunk: int):
  """MoBA of ``Tq`` queries against a whole sequence of keys (``top_k >=
  2``).

  Args:
    q: ``[B, Tq, H, K]``, the queries at positions ``q_offset .. q_offset +
      Tq - 1``.
    k, v: ``[B, T, Hkv, *]``, every key of the sequence.
    doc: ``[B, T]`` document index of every position.
    q_offset: the first query's position (an int, traced or not).
    halo: static, ``<= C - 1``: the keys before the first query that the
      own-block pass reads (``C - 1`` unless ``q_offset`` is 0).
    block_size, top_k, scale: as in ``parallel_moba``; chunk: ``c``.
  Returns:
    ``o [B, Tq, H, V]`` float32.
  """
  b, tq = q.shape[:2]
  t = k.shape[1]
  c = min(chunk, tq)
  pos = jnp.arange(t, dtype=jnp.int32)
  start = blocks.block_starts(pos[None], blocks.document_starts(doc),
                              block_size)                       # [B, T]
  q_doc = jax.lax.dynamic_slice_in_dim(doc, q_offset, tq, axis=1)
  q_start = jax.lax.dynamic_slice_in_dim(start, q_offset, tq, axis=1)

  def window(x, fill):                    # positions q_offset - halo ..
    pad = [(0, 0), (halo, 0)] + [(0, 0)] * (x.ndim - 2)
    return jax.lax.dynamic_slice_in_dim(
        jnp.pad(x, pad, constant_values=fill), q_offset, halo + tq, axis=1)

  o_own, lse_own = _own_block(q, window(k, 0), window(v, 0), q_start,
                              window(start, -1), halo=halo,
                              block_size=block_size, chunk=c, scale=scale)
  rows = padded_positions(np.arange(tq), c)
  parts = [(o_own, lse_own, rows)]
  if t // block_size:
    first, doc_of = blocks.full_blocks(doc, block_size)
    kb = blocks.gather_blocks(k, first, block_size)             # [B,NF,C,h,K]
    vb = blocks.gather_blocks(v, first, block_size)             # [B,NF,C,h,V]
    means = jnp.sum(jnp.asarray(kb, _F32), axis=2) / block_size
    qp = pad_time(jnp.asarray(q, _F32), c)
    sel = select_blocks(qp, means, first, doc_of, pad_time(q_doc, c),
                        jnp.pad(q_start, ((0, 0), (0, qp.shape[1] - tq)),
                                constant_values=-1),
                        top_k=top_k, chunk=c)
    parts.append(selected_block_attention(qp, kb, vb, sel, scale=scale,
                                          chunk=c) + (rows,))
  return merge_passes(parts, tq)


@context_parallel.splits_sequence(lambda: split.context_parallel_moba)
def chunk_moba(q, k, v, *, block_size: int, top_k: int, scale=None,
               segment_ids=None, chunk_size: int = 64):
  """Blockwise MoBA; never forms ``[T, T]`` (costs in the module docstring).

  Arguments and result as in ``parallel_moba``, plus:
    chunk_size: ``c``, queries (and keys) per tile of the blockwise passes
      (speed only; distinct from MoBA's ``block_size``).

  ``top_k = 1`` (causal attention) runs ``chunk_softmax_attn``.

  Example:
    >>> q = jnp.ones((1, 300, 4, 8)); k = v = jnp.ones((1, 300, 2, 8))
    >>> chunk_moba(q, k, v, block_size=32, top_k=3, chunk_size=16).shape
    (1, 300, 4, 8)
  """
  b, t, _, _, dk, _ = validate(q, k, v, segment_ids, block_size, top_k)
  checks.positive_int("chunk_size", chunk_size)
  scale = default_scale(scale, dk)
  if top_k == 1:
    return chunk_softmax_attn(q, k, v, scale=scale, segment_ids=segment_ids,
                              block_size=chunk_size)
  o = blockwise_moba(q, k, v, blocks.documents(segment_ids, b, t),
                     q_offset=0, halo=0, block_size=block_size, top_k=top_k,
                     scale=scale, chunk=chunk_size)
  return o.astype(v.dtype)
