"""Padding a sequence to whole chunks and splitting it into chunks."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def pad_time(x, multiple: int, *, axis: int = 1, mode: str = "zeros"):
  """Pads axis ``axis`` up to a multiple of ``multiple``.

  ``mode="zeros"`` pads with zeros (for q, k, v and log-gates: a zero key adds
  nothing and a zero log-gate decays nothing); ``mode="edge"`` repeats the
  last entry (for segment ids: padding never starts a new document).
  """
  length = x.shape[axis]
  pad = (-length) % multiple
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  if mode == "edge":
    return jnp.pad(x, widths, mode="edge")
  return jnp.pad(x, widths)


def chunk_layout(t: int, chunk_size: int, sub_chunk_size: int):
  """``(chunk, sub_chunk)`` actually used for a sequence of length ``t``."""
  c = min(sub_chunk_size, chunk_size)
  # A sequence shorter than a chunk only needs enough whole sub-chunks.
  return min(chunk_size, -(-t // c) * c), c


def split_chunks(x, chunk_size: int, *, axis: int = 1):
  """``[B, T, ...] -> [B, N, C, ...]`` for T a multiple of ``chunk_size``."""
  shape = x.shape
  n = shape[axis] // chunk_size
  return x.reshape(shape[:axis] + (n, chunk_size) + shape[axis + 1:])


def merge_chunks(x, *, axis: int = 1):
  """``[B, N, C, ...] -> [B, N * C, ...]``."""
  shape = x.shape
  return x.reshape(shape[:axis] + (shape[axis] * shape[axis + 1],)
                   + shape[axis + 2:])


# Tokens of a batch row whose chunk-local terms are alive at once (memory
# and cache, not results): groups that fit in cache beat one pass over every
# chunk (see docs/performance.md).
TOKENS_PER_GROUP = 512


def chunks_per_group(chunk: int) -> int:
  """Chunks of ``chunk`` tokens per group of ``map_chunk_groups``."""
  return max(1, TOKENS_PER_GROUP // chunk)


# Floats of one ``[C, width]`` term per group of ``chunks_in_budget``, for
# every head: 512 KiB (see docs/performance.md).
GROUP_FLOATS = 1 << 17


def chunks_in_budget(chunk: int, floats_per_token: int) -> int:
  """Chunks of ``chunk`` tokens per group of ``map_chunk_groups`` such
  that a term of ``floats_per_token`` floats per token (all heads) holds
  ``GROUP_FLOATS``: for KDA with 4 heads of width 64 in chunks of 64, 8
  chunks; with heads of width 128, 4."""
  return max(1, GROUP_FLOATS // (chunk * floats_per_token))


def map_chunk_groups(fn, operands, group: int, remat: bool = True):
  """``fn(*operands)`` over groups of ``group`` chunks (axis 1), rematerialised.

  Mapping over groups and recomputing each group's intermediates in the
  backward pass keeps only one group's worth alive (and in cache);
  ``remat=False`` keeps them instead (where the backward pass needs a
  result that a recomputation would cost again in full). The map
  runs over (batch row, group) pairs: ``[B, N, ...] -> [B * groups, group,
  ...]`` is a reshape, where moving a group axis before the batch axis
  would copy every operand. Every operand and output has the ``[B, N]``
  leading axes; ``fn`` must treat the chunks independently.
  """
  b, n = operands[0].shape[:2]
  if n <= group:
    return fn(*operands)
  steps = -(-n // group)

  def to_groups(x):
    x = jnp.pad(x, [(0, 0), (0, steps * group - n)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape((b * steps, group) + x.shape[2:])

  def from_groups(y):
    return y.reshape((b, steps * group) + y.shape[2:])[:, :n]

  def one_group(xs):
    return jax.tree.map(lambda y: y[0], fn(*(x[None] for x in xs)))

  out = jax.lax.map(jax.checkpoint(one_group) if remat else one_group,
                    tuple(to_groups(x) for x in operands))
  return jax.tree.map(from_groups, out)
