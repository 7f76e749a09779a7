"""Blocks of native sparse attention, the softmax and the gated sum.

Blocks are laid on positions within each document: block ``c`` of a
document starting at position ``d`` holds positions ``d + c l .. d + (c +
1) l - 1`` (``l = block_size``), cut short by the document's end. So no
block straddles a document boundary, and a packed row gives every
document the output it has alone. A block is *complete* once its last
position ``d + (c + 1) l - 1`` exists in the document; only complete blocks
are compressed. Complete blocks hold ``l`` tokens each and never overlap,
so a row of ``T`` tokens has at most ``T // l`` of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags

_F32 = jnp.float32


def document_start(segment_ids, batch: int, length: int):
  """``[B, T]`` int32: the position where each token's document starts."""
  pos = jnp.arange(length, dtype=jnp.int32)
  starts = reset_flags(segment_ids, batch, length)
  return jax.lax.cummax(jnp.where(starts, pos, 0), axis=1)


def is_block_end(positions, doc_start, block_size: int):
  """``[B, T]`` bool: True at the last token of a complete block."""
  return (positions - doc_start) % block_size == block_size - 1


def compact_ends(is_end, positions, size: int):
  """The positions where ``is_end``, in order, ``[B, size]`` int32 with
  ``-1`` after the last; ends past ``size`` are dropped (the callers size
  it to hold them all)."""
  b = is_end.shape[0]
  rank = jnp.cumsum(is_end, axis=1, dtype=jnp.int32) - 1        # [B, T]
  slot = jnp.where(is_end, rank, size)
  rows = jnp.arange(b)[:, None]
  return jnp.full((b, size), -1, jnp.int32).at[rows, slot].set(
      positions.astype(jnp.int32), mode="drop")


def pool_blocks(x, ends, block_size: int):
  """Means of the blocks ending at ``ends``, read from ``x``.

  Args:
    x: ``[B, S, Hkv, D]``, indexed by position.
    ends: ``[B, N]`` int32 last positions of complete blocks, ``-1`` for
      none.
  Returns:
    ``[B, N, Hkv, D]`` float32, zero where ``ends`` is ``-1``.
  """
  b, n = ends.shape
  offsets = jnp.arange(block_size, dtype=jnp.int32) - (block_size - 1)
  rows = jnp.clip(ends[..., None] + offsets, 0, x.shape[1] - 1)  # [B, N, l]
  picked = jnp.take_along_axis(
      x, rows.reshape(b, n * block_size, 1, 1), axis=1)     # [B, N l, Hkv, D]
  mean = jnp.mean(picked.reshape((b, n, block_size) + x.shape[2:])
                  .astype(_F32), axis=2)                        # [B, N, Hkv, D]
  return jnp.where((ends >= 0)[..., None, None], mean, 0.0)


def masked_softmax(s, mask):
  """``softmax(s)`` over the last axis restricted to ``mask``; rows with
  nothing allowed are all zero. The mask is applied before ``exp``, so a
  masked score neither overflows nor receives a gradient."""
  s = jnp.where(mask, s, -jnp.inf)
  top = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
  e = jnp.exp(s - jnp.where(jnp.isfinite(top), top, 0.0))
  total = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(total > 0, total, 1.0)


def mix(branches, gates, dtype):
  """``sum_b g_b * o_b`` in float32, cast to ``dtype``: ``branches`` and
  ``gates`` in the order compressed, selected, window (the window's pair
  absent or None without a window); ``o_b [B, T, H, V]``, ``g_b [B, T,
  H]``."""
  o = 0.0
  for branch, gate in zip(branches, gates):
    if branch is not None:
      o = o + jnp.asarray(gate, _F32)[..., None] * branch
  return o.astype(dtype)
