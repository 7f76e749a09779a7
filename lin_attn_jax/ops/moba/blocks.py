"""Where MoBA's blocks lie: documents, block starts, the table of full
blocks.

Blocks are laid per document: the block of a token at position ``i`` in a
document starting at ``d`` begins at ``d + floor((i - d) / C) C`` (``C =
block_size``), so a document is cut into blocks from its own first token,
as if it were alone (flash-linear-attention's ``prepare_moba_chunks`` cuts
each sequence of ``cu_seqlens`` the same way). Only a document's last block
may be partial, and no query can select it (it is nobody's past block), so
every candidate block holds ``C`` keys of one document.

Letters: b batch, n full block, c position in a block, h key/value head,
k key channel, v value channel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import document_index


def documents(segment_ids, batch: int, length: int):
  """``[B, T]`` int32 document index of every position (0 without
  segment ids)."""
  if segment_ids is None:
    return jnp.zeros((batch, length), jnp.int32)
  return document_index(segment_ids, batch, length)


def document_starts(doc):
  """``[B, T]`` int32: the position where each token's document starts,
  from its document index ``doc [B, T]``."""
  b, t = doc.shape
  pos = jnp.arange(t, dtype=jnp.int32)
  first = jnp.concatenate([jnp.ones((b, 1), bool), doc[:, 1:] != doc[:, :-1]],
                          axis=1)
  return jax.lax.cummax(jnp.where(first, pos[None], 0), axis=1)


def block_starts(positions, doc_start, block_size: int):
  """The first position of each token's block: ``d + floor((i - d) / C)
  C`` for position ``i`` in a document starting at ``d``."""
  return doc_start + (positions - doc_start) // block_size * block_size


def full_blocks(doc, block_size: int):
  """The table of full blocks of every row, in order of position.

  Args:
    doc: ``[B, T]`` document index.
    block_size: ``C``.
  Returns:
    ``(first [B, NF] int32, doc_of [B, NF] int32)`` with ``NF = T // C``
    (no row holds more full blocks): the first position of the row's
    ``n``-th full block and its document; entries past the row's last full
    block hold ``first = T`` and ``doc_of = -1``.
  """
  b, t = doc.shape
  slots = t // block_size
  pos = jnp.arange(t, dtype=jnp.int32)
  start = block_starts(pos[None], document_starts(doc), block_size)
  last = jnp.minimum(pos + block_size - 1, t - 1)                # [T]
  is_full = ((pos[None] == start) & (pos[None] + block_size <= t)
             & (doc[:, last] == doc))                           # [B, T]
  # The n-th full block's first position lands in slot n; the others are
  # dropped past the end.
  slot = jnp.where(is_full, jnp.cumsum(is_full, axis=1) - 1, slots)
  rows = jnp.arange(b)[:, None]
  first = jnp.full((b, slots), t, jnp.int32).at[rows, slot].set(
      jnp.broadcast_to(pos, (b, t)), mode="drop")
  doc_of = jnp.full((b, slots), -1, jnp.int32).at[rows, slot].set(
      doc, mode="drop")
  return first, doc_of


def gather_blocks(x, first, block_size: int):
  """The tokens of each full block: ``x [B, T, Hkv, W]`` -> ``[B, NF, C,
  Hkv, W]`` (block ``n`` is ``x[:, first[:, n] + c]``; rows of an empty
  slot repeat the last token and are never read)."""
  t = x.shape[1]
  index = jnp.minimum(first[:, :, None] + jnp.arange(block_size), t - 1)
  rows = jnp.arange(x.shape[0])[:, None, None]
  return x[rows, index]                                         # [B,NF,C,h,W]
