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

A causal window without global positions, short against the sequence
(``banded_fits``), takes a dense path instead (``banded_attention``): each
query block against the same key blocks, laid side by side as one ``[C,
(p + 1) C]`` score block under a fixed band mask, over rematerialised
groups of blocks; no gathers or scatters of blocks.

``block_size`` changes speed, never results beyond float tolerance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import context_parallel
from lin_attn_jax.ops.common.chunking import (chunks_in_budget,
                                             map_chunk_groups, pad_time)
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


def blocks_before(window_size: int, block: int) -> int:
  """``p = ceil((w - 1) / C)``: the key blocks before a query block's own
  that hold a key of some query's causal window."""
  return -(-(window_size - 1) // block)


def banded_fits(length: int, block: int, window_size: int) -> bool:
  """Whether a causal window takes ``banded_attention``: where its ``p``
  key blocks before each query block are at most a quarter of the ``N``
  blocks. The banded blocks then hold at most ``p / 2N`` (an eighth) more
  pairs than the blockwise pass, which skips the key blocks before the
  sequence's start; a window as long as the sequence takes the blockwise
  pass (see docs/performance.md)."""
  return 4 * blocks_before(window_size, block) <= -(-length // block)


def banded_attention(q, k, v, doc, *, window_size: int, block: int, scale):
  """Causal sliding-window attention without global positions.

  Query block ``n`` attends to key blocks ``n - p .. n`` (``p = ceil((w -
  1) / C)``, the blocks that ``window_key_blocks`` finds, at most ``N -
  1``), laid side by side: one ``[C, (p + 1) C]`` score block per query
  block and head, masked by the band ``0 <= i - j < w`` (fixed for every
  block) and by documents. Keys
  before the sequence's start carry document -1, which no query has. The
  blocks run over rematerialised groups (``map_chunk_groups``) sized so
  that a group's scores hold about ``chunking.GROUP_FLOATS`` floats.

  Args:
    q: ``[B, Tp, H, K]``; k, v: ``[B, Tp, Hkv, *]``, float32, ``Tp`` a
      multiple of ``block``; doc: ``[B, Tp]`` int document index or None.
    window_size: ``w``; block: ``C``; scale: multiplies the scores.
  Returns:
    ``o [B, Tp, H, V]`` float32.
  """
  b, tp, h, dk = q.shape
  hkv, dv = k.shape[2], v.shape[-1]
  g, c = h // hkv, block
  n = tp // c
  # No more key blocks than the sequence has before a query block.
  p = min(blocks_before(window_size, c), n - 1)
  keys = (p + 1) * c

  def windows(x, fill):                  # [B, Tp, ...] -> [B, N, (p+1)C, ...]
    x = jnp.pad(x, [(0, 0), (p * c, 0)] + [(0, 0)] * (x.ndim - 2),
                constant_values=fill)
    blocks = x.reshape((b, n + p, c) + x.shape[2:])
    return jnp.concatenate([blocks[:, i:i + n] for i in range(p + 1)], axis=2)

  doc = jnp.zeros((b, tp), jnp.int32) if doc is None else doc
  q_b = q.reshape(b, n, c, hkv, g, dk).transpose(0, 1, 3, 4, 2, 5)
  k_w, v_w = (jnp.moveaxis(windows(x, 0), 3, 2) for x in (k, v))
  doc_q, doc_w = doc.reshape(b, n, c), windows(doc, -1)
  rel = np.arange(c)[:, None] + p * c - np.arange(keys)[None, :]  # i - j
  band = jnp.asarray((rel >= 0) & (rel < window_size))        # [C, (p+1)C]

  def attend(q_b, k_w, v_w, doc_q, doc_w):
    s = scale * jnp.einsum("bnhgik,bnhjk->bnhgij", q_b, k_w,
                           preferred_element_type=jnp.float32)
    allowed = band & (doc_q[..., :, None] == doc_w[..., None, :])
    s = jnp.where(allowed[:, :, None, None], s, -jnp.inf)
    # Every row allows its own position (the band's diagonal): no empty row.
    return jnp.einsum("bnhgij,bnhjv->bnhgiv", jax.nn.softmax(s, axis=-1),
                      v_w, preferred_element_type=jnp.float32)

  o = map_chunk_groups(attend, (q_b, k_w, v_w, doc_q, doc_w),
                       chunks_in_budget(c, h * keys))   # [B,N,hkv,g,C,V]
  return o.transpose(0, 1, 4, 2, 3, 5).reshape(b, tp, h, dv)


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
  if (causal and window_size is not None and not glob.size
      and banded_fits(t, c, window_size)):
    return banded_attention(qp, kp, vp, doc, window_size=window_size,
                            block=c, scale=scale)[:, :t].astype(v.dtype)

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
