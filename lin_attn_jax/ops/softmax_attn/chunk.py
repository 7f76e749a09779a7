"""Blockwise softmax attention (flash-attention style) in plain JAX.

The sequence is cut into blocks of ``C`` positions. Only block pairs that can
hold an allowed entry are computed (``blocksparse.blocksparse_attention``):

- full causal attention: key blocks ``0..n`` for query block ``n``
  (``N (N + 1) / 2`` pairs);
- a window ``w``: the ``ceil((w - 1) / C) + 1`` key blocks that overlap the
  window of some query of the block, so time and memory grow as
  ``T * (w + C)``, not ``T^2``;
- global positions: their keys are gathered into extra key blocks that
  every query block visits (masked to pairs outside the window), and their
  queries into extra query blocks that visit every key block (masked to
  non-global keys outside the window). The two passes count disjoint pairs
  and are merged exactly through their log-sum-exp.

``block_size`` changes speed, never results beyond float tolerance.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import context_parallel
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.softmax_attn import context_parallel as split
from lin_attn_jax.ops.softmax_attn import masks
from lin_attn_jax.ops.softmax_attn.blocksparse import (blocksparse_attention,
                                                       merge_passes)
from lin_attn_jax.ops.softmax_attn.inputs import (check_block_size,
                                                  default_scale, validate)


def padded_positions(positions, block: int) -> np.ndarray:
  """Positions padded with -1 up to a multiple of ``block``."""
  positions = np.asarray(positions, np.int64)
  return np.concatenate([positions,
                         np.full(((-positions.size) % block,), -1, np.int64)])


def window_key_blocks(n: int, num_blocks: int, block: int, *, causal: bool,
                      window_size) -> range:
  """Key blocks holding a key in the window of some query of block ``n``."""
  first_q, last_q = n * block, (n + 1) * block - 1
  if window_size is None:
    return range(0, n + 1 if causal else num_blocks)
  lo = max(0, first_q - (window_size - 1)) // block
  hi = n if causal else min(num_blocks - 1,
                            (last_q + window_size - 1) // block)
  return range(lo, hi + 1)


def gather_rows(x, positions: np.ndarray):
  """``x[:, positions]`` along T, zeros where ``positions`` is -1."""
  take = jnp.asarray(np.maximum(positions, 0))
  keep = jnp.asarray(positions >= 0).reshape((1, -1) + (1,) * (x.ndim - 2))
  return jnp.where(keep, x[:, take], 0)


def sequence_block_pairs(length: int, block: int, glob_pos: np.ndarray, *,
                         causal: bool, window_size):
  """Pairs of the pass over all queries: the key blocks of the window (rule
  BASE), then the gathered global-key blocks after the ``N`` sequence blocks
  (rule GLOBAL_KEY)."""
  n = -(-length // block)
  ng = glob_pos.size // block
  q_blocks, k_blocks, rule_ids = [], [], []
  for qn in range(n):
    keys = list(window_key_blocks(qn, n, block, causal=causal,
                                  window_size=window_size))
    last_q = min(length, (qn + 1) * block) - 1
    globals_ = [n + gn for gn in range(ng)
                if not causal or glob_pos[gn * block] <= last_q]
    q_blocks += [qn] * (len(keys) + len(globals_))
    k_blocks += keys + globals_
    rule_ids += [masks.BASE] * len(keys) + [masks.GLOBAL_KEY] * len(globals_)
  return q_blocks, k_blocks, rule_ids


def global_query_block_pairs(length: int, block: int, glob_pos: np.ndarray, *,
                             causal: bool):
  """Pairs of the pass over gathered global queries: every key block at or
  before the block's last global position (rule GLOBAL_QUERY)."""
  n = -(-length // block)
  q_blocks, k_blocks = [], []
  for gn in range(glob_pos.size // block):
    last_global = glob_pos[gn * block:(gn + 1) * block].max()
    keys = range(last_global // block + 1 if causal else n)
    q_blocks += [gn] * len(keys)
    k_blocks += list(keys)
  return q_blocks, k_blocks, [masks.GLOBAL_QUERY] * len(q_blocks)


@context_parallel.splits_sequence(
    lambda: split.context_parallel_softmax_attn)
def chunk_softmax_attn(q, k, v, *, scale=None, causal=True, window_size=None,
                       segment_ids=None, global_positions=None,
                       block_size=128):
  """Blockwise softmax attention; never forms ``[T, T]``.

  Arguments and result as in ``parallel_softmax_attn``, plus:
    block_size: ``C``, query and key positions per block (speed only).

  Example:
    >>> q = jnp.ones((1, 300, 4, 8)); k = v = jnp.ones((1, 300, 2, 8))
    >>> chunk_softmax_attn(q, k, v, window_size=64, block_size=32).shape
    (1, 300, 4, 8)
  """
  b, t, h, hkv, dk, dv, glob = validate(q, k, v, segment_ids, window_size,
                                        global_positions)
  check_block_size(block_size)
  scale = default_scale(scale, dk)
  c = min(block_size, t)
  if window_size is None:
    glob = glob[:0]                     # the full pattern already has them
  flags = masks.global_flags_table(glob, t)
  rule = masks.WindowGlobalRule(causal=causal, window_size=window_size,
                                global_flags=flags)

  seq_pos = padded_positions(np.arange(t), c)                   # [N*C]
  glob_pos = padded_positions(glob, c)                          # [NG*C]
  ng = glob_pos.size // c
  doc = (None if segment_ids is None
         else pad_time(document_index(segment_ids, b, t), c, mode="edge"))
  qp, kp, vp = (pad_time(jnp.asarray(x, jnp.float32), c) for x in (q, k, v))

  k_pos = np.concatenate([seq_pos, glob_pos])
  k_all = jnp.concatenate([kp, gather_rows(k, glob_pos)], axis=1)
  v_all = jnp.concatenate([vp, gather_rows(v, glob_pos)], axis=1)
  doc_k = (None if doc is None
           else jnp.concatenate([doc, gather_rows(doc, glob_pos)], axis=1))
  o, lse = blocksparse_attention(
      qp, k_all, v_all, doc, doc_k, q_pos=seq_pos, k_pos=k_pos,
      pairs=sequence_block_pairs(t, c, glob_pos, causal=causal,
                                 window_size=window_size),
      rule=rule, block_size=c, scale=scale)
  parts = [(o, lse, seq_pos)]

  if ng:
    o_g, lse_g = blocksparse_attention(
        gather_rows(q, glob_pos), kp, vp,
        None if doc is None else gather_rows(doc, glob_pos), doc,
        q_pos=glob_pos, k_pos=seq_pos,
        pairs=global_query_block_pairs(t, c, glob_pos, causal=causal),
        rule=rule, block_size=c, scale=scale)
    parts.append((o_g, lse_g, glob_pos))
  return merge_passes(parts, t).astype(v.dtype)
