"""Sparse Transformer attention as a block-sparse computation.

Strided pattern, two passes merged through their log-sum-exp:

1. ``A1`` (the previous ``l`` positions) in sequence order: a band of
   ``ceil((l - 1) / C) + 1`` key blocks per query block.
2. ``A2`` outside ``A1`` in residue-major order: positions are regrouped by
   ``p mod l`` (position ``a l + r`` goes to group ``r``, index ``a``), so
   ``A2`` becomes causal attention inside each group of ``ceil(T / l)``
   positions; blocks of different groups are never computed.

Fixed pattern, one pass: ``A1`` is a band of the key blocks overlapping the
query's block of ``l``, and the summary positions (``c`` of every ``l``) are
gathered into extra key blocks that every query block visits.

With ``l`` near ``sqrt(T)`` both cost ``O(T sqrt(T))`` instead of ``O(T^2)``.
``sparse_attn_reference`` is the dense masked form beside it.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.softmax_attn.blocksparse import (blocksparse_attention,
                                                       merge_passes)
from lin_attn_jax.ops.softmax_attn.chunk import (gather_rows, padded_positions,
                                                 window_key_blocks)
from lin_attn_jax.ops.softmax_attn.inputs import check_block_size, default_scale
from lin_attn_jax.ops.sparse_attn import patterns
from lin_attn_jax.ops.sparse_attn.inputs import validate


def residue_major_positions(length: int, stride: int, block: int):
  """Positions grouped by ``p mod stride``, each group padded to whole blocks.

  Returns:
    ``(positions [stride * G * block], G)`` with ``G`` blocks per group and
    ``-1`` for padding.
  """
  per_group = -(-length // stride)
  blocks = -(-per_group // block)
  grid = np.full((stride, blocks * block), -1, np.int64)
  for r in range(stride):
    members = np.arange(r, length, stride)
    grid[r, :members.size] = members
  return grid.reshape(-1), blocks


def local_block_pairs(length: int, stride: int, block: int, *, causal: bool):
  """Strided ``A1`` in sequence order: a band of key blocks."""
  n = -(-length // block)
  q_blocks, k_blocks = [], []
  for qn in range(n):
    keys = window_key_blocks(qn, n, block, causal=causal, window_size=stride)
    q_blocks += [qn] * len(keys)
    k_blocks += list(keys)
  return q_blocks, k_blocks, [patterns.LOCAL] * len(q_blocks)


def residue_block_pairs(stride: int, per_group: int, *, causal: bool):
  """Strided ``A2`` in residue-major order: block pairs inside each group."""
  q_blocks, k_blocks = [], []
  for r in range(stride):
    for a in range(per_group):
      keys = range(a + 1) if causal else range(per_group)
      q_blocks += [r * per_group + a] * len(keys)
      k_blocks += [r * per_group + kb for kb in keys]
  return q_blocks, k_blocks, [patterns.STRIDE] * len(q_blocks)


def fixed_block_pairs(length: int, stride: int, summary_pos: np.ndarray,
                      block: int, *, causal: bool):
  """Fixed pattern: the blocks overlapping each query's block of ``stride``
  (rule BLOCK), then the gathered summary blocks after the ``N`` sequence
  blocks (rule SUMMARY)."""
  n = -(-length // block)
  ns = summary_pos.size // block
  q_blocks, k_blocks, rule_ids = [], [], []
  for qn in range(n):
    first_q, last_q = qn * block, min(length, (qn + 1) * block) - 1
    lo = (first_q // stride) * stride // block
    hi = min(n - 1, ((last_q // stride + 1) * stride - 1) // block)
    if causal:
      hi = min(hi, qn)
    keys = list(range(lo, hi + 1))
    summaries = [n + sn for sn in range(ns)
                 if not causal or summary_pos[sn * block] <= last_q]
    q_blocks += [qn] * (len(keys) + len(summaries))
    k_blocks += keys + summaries
    rule_ids += [patterns.BLOCK] * len(keys)
    rule_ids += [patterns.SUMMARY] * len(summaries)
  return q_blocks, k_blocks, rule_ids


def parallel_sparse_attn(q, k, v, *, stride, pattern="strided",
                         summary_size=1, causal=True, scale=None,
                         segment_ids=None, block_size=64):
  """Sparse Transformer attention, skipping empty blocks.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``, with
      ``H`` a multiple of ``Hkv``.
    stride: ``l``, the stride (strided) or block length (fixed).
    pattern: ``"strided"`` or ``"fixed"`` (see ``patterns``).
    summary_size: ``c``, summary positions per block of the fixed pattern.
    causal: intersect the pattern with ``j <= i``.
    scale: score scale, ``K ** -0.5`` when None.
    segment_ids: ``[B, T]`` int; no attention across a change of id.
    block_size: ``C``, positions per block (speed only).
  Returns:
    ``o [B, T, H, V]`` in v's dtype.

  Example:
    >>> q = k = v = jnp.ones((1, 256, 2, 16))
    >>> parallel_sparse_attn(q, k, v, stride=16).shape
    (1, 256, 2, 16)
  """
  b, t, dk = validate(q, k, v, segment_ids, pattern, stride, summary_size)
  check_block_size(block_size)
  scale = default_scale(scale, dk)
  c = min(block_size, t)
  rule = patterns.SparseRule(stride=stride, summary_size=summary_size,
                             causal=causal)
  seq_pos = padded_positions(np.arange(t), c)
  doc = (None if segment_ids is None
         else pad_time(document_index(segment_ids, b, t), c, mode="edge"))
  qp, kp, vp = (pad_time(jnp.asarray(x, jnp.float32), c) for x in (q, k, v))

  if pattern == "fixed":
    summary = np.arange(t)[np.asarray(patterns.is_summary(
        np.arange(t), stride, summary_size))]
    summary_pos = padded_positions(summary, c)
    pairs = fixed_block_pairs(t, stride, summary_pos, c, causal=causal)
    doc_k = (None if doc is None
             else jnp.concatenate([doc, gather_rows(doc, summary_pos)], 1))
    o, lse = blocksparse_attention(
        qp, jnp.concatenate([kp, gather_rows(k, summary_pos)], 1),
        jnp.concatenate([vp, gather_rows(v, summary_pos)], 1), doc, doc_k,
        q_pos=seq_pos, k_pos=np.concatenate([seq_pos, summary_pos]),
        pairs=pairs, rule=rule, block_size=c, scale=scale)
    return merge_passes([(o, lse, seq_pos)], t).astype(v.dtype)

  o, lse = blocksparse_attention(
      qp, kp, vp, doc, doc, q_pos=seq_pos, k_pos=seq_pos,
      pairs=local_block_pairs(t, stride, c, causal=causal),
      rule=rule, block_size=c, scale=scale)
  parts = [(o, lse, seq_pos)]
  if t > stride:
    c_group = min(c, -(-t // stride))
    perm, per_group = residue_major_positions(t, stride, c_group)
    doc_perm = None if doc is None else gather_rows(doc, perm)
    o_s, lse_s = blocksparse_attention(
        gather_rows(q, perm), gather_rows(k, perm), gather_rows(v, perm),
        doc_perm, doc_perm, q_pos=perm, k_pos=perm,
        pairs=residue_block_pairs(stride, per_group, causal=causal),
        rule=rule, block_size=c_group, scale=scale)
    parts.append((o_s, lse_s, perm))
  return merge_passes(parts, t).astype(v.dtype)
