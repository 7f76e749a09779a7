"""Kernel layout of the forgetting-attention kernels: padding, per-token
rows, document indices and the key (or query) blocks each program visits.

- Token arrays keep the public order ``[B, T, H, F]``, T zero-padded to
  whole blocks of every kernel and F to the backend's tiles (TPU: whole
  128-lane tiles, GPU: a power of two >= 16). On TPU they are viewed as
  ``[B, T, H F]`` (a free reshape) so that one head's block is a ``[block,
  F]`` tile at lane block ``h``; on GPU a head is a strided block.
- Per-token values of a head (the cumulative gates ``c``, the log-sum-exp,
  ``delta``) are rows ``[B, H, T]`` (TPU: ``[B, H, 1, T]``, lane-major), so
  a block of them is a row ``[1, block]`` (TPU) or a vector (GPU); kernels
  turn a row into a column where the scores need one.
- Documents: the index of every token's document, float32 ``[B, T]``
  (TPU: ``[B, 1, T]``; exact below 2^24 documents). Padded tokens form one
  more document, so that they see no real key and no real query sees them;
  without segment ids the index is there only when T is padded.
- Block skipping: a query block visits the key blocks from its first
  visible key to its diagonal; a key block is visited by the query blocks
  from its diagonal to its last visible query. The bounds that depend only
  on positions (causality, the window) are static; those of documents
  (indices only grow along a row, so a block's first query sees nothing
  before its document's start, and a block's last key is seen by nothing
  after its document's end) enter as int32 arrays per block.

Letters: b batch, t token, h head, f feature.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.common.layout import (pad_to, padded_features,
                                          round_up)
from pallas_kernels.forgetting_attn.block_sizes import BlockSizes, Tiles

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Layout:
  """Shapes of one call in the kernels' layout."""
  backend: str            # "tpu" or "gpu"
  batch: int              # B
  length: int             # T
  t_pad: int              # T padded to whole blocks of every kernel
  heads: int              # H, query heads (and forget gates)
  kv_heads: int           # key and value heads; H is a multiple
  dim_k: int              # K
  dim_v: int              # V
  k_pad: int              # K padded to the backend's tiles
  v_pad: int              # V padded likewise
  tiles: Tiles            # block sizes, capped to t_pad
  window: int | None      # keys with i - j < window are visible
  documents: bool         # a document index enters the kernels

  @property
  def groups(self) -> int:
    """Query heads per key and value head."""
    return self.heads // self.kv_heads


def _cap(length: int, backend: str) -> int:
  """The largest useful block for ``length`` tokens: one block of the
  smallest valid size that holds them all."""
  base = 128 if backend == "tpu" else 16
  return base * (1 << (max(1, -(-length // base)) - 1).bit_length())


def make_layout(q_shape, kv_heads: int, dim_v: int, blocks: BlockSizes, *,
                bf16: bool, window: int | None, segments: bool) -> Layout:
  b, t, h, dk = q_shape
  backend = blocks.backend
  k_pad, v_pad = (padded_features(dk, backend),
                  padded_features(dim_v, backend))
  tiles = blocks.tiles(bf16=bf16, k_pad=k_pad, v_pad=v_pad)
  cap = _cap(t, backend)
  tiles = dataclasses.replace(
      tiles, block_q=min(tiles.block_q, cap), block_k=min(tiles.block_k, cap),
      backward_block_q=min(tiles.backward_block_q, cap),
      backward_block_k=min(tiles.backward_block_k, cap),
      dq_block_q=min(tiles.dq_block_q, cap))
  whole = math.lcm(tiles.block_q, tiles.block_k, tiles.backward_block_q,
                   tiles.backward_block_k, tiles.dq_block_q)
  t_pad = round_up(t, whole)
  return Layout(backend=backend, batch=b, length=t, t_pad=t_pad, heads=h,
                kv_heads=kv_heads, dim_k=dk, dim_v=dim_v, k_pad=k_pad,
                v_pad=v_pad, tiles=tiles, window=window,
                documents=segments or t_pad > t)


def tokens_to_kernel(x, lay: Layout, width: int, dtype):
  """``[B, T, Hx, F] -> [B, T_pad, Hx, width]`` (GPU) or ``[B, T_pad, Hx
  width]`` (TPU), zero-padded, in ``dtype``."""
  b, _, hx, _ = x.shape
  x = pad_to(x.astype(dtype), (b, lay.t_pad, hx, width))
  return x.reshape(b, lay.t_pad, hx * width) if lay.backend == "tpu" else x


def tokens_from_kernel(x, lay: Layout, heads: int, width: int):
  """The inverse of ``tokens_to_kernel``: ``[B, T, Hx, width]``."""
  x = x.reshape(lay.batch, lay.t_pad, heads, -1)
  return x[:, :lay.length, :, :width]


def rows_to_kernel(x, lay: Layout, *, edge: bool = False):
  """Per-token values ``[B, T, H]`` -> float32 rows ``[B, H, T_pad]`` (TPU:
  ``[B, H, 1, T_pad]``), padded with zeros or (``edge``) the last value."""
  x = jnp.swapaxes(jnp.asarray(x, _F32), 1, 2)                  # [B, H, T]
  x = jnp.pad(x, ((0, 0), (0, 0), (0, lay.t_pad - lay.length)),
              mode="edge" if edge else "constant")
  return x[:, :, None] if lay.backend == "tpu" else x


def rows_from_kernel(x, lay: Layout):
  """``[B, H, (1,) T_pad] -> [B, T, H]``."""
  x = x.reshape(lay.batch, lay.heads, lay.t_pad)
  return jnp.swapaxes(x[:, :, :lay.length], 1, 2)


def documents_to_kernel(doc, lay: Layout):
  """The document index ``[B, T]`` (or None: one document) -> float32
  ``[B, T_pad]`` (TPU: ``[B, 1, T_pad]``), padded tokens in a document of
  their own; None when no index is needed."""
  if not lay.documents:
    return None
  if doc is None:
    doc = jnp.zeros((lay.batch, lay.length), _F32)
  doc = jnp.asarray(doc, _F32)
  pad = jnp.broadcast_to(doc[:, -1:] + 1, (lay.batch, lay.t_pad - lay.length))
  doc = jnp.concatenate([doc, pad], axis=1)
  return doc[:, None] if lay.backend == "tpu" else doc


def document_index(segment_ids):
  """``[B, T]`` int32: the number of id changes up to and including t (a
  document is a run of equal ids)."""
  ids = jnp.asarray(segment_ids)
  starts = jnp.pad(ids[:, 1:] != ids[:, :-1], ((0, 0), (1, 0)))
  return jnp.cumsum(starts.astype(jnp.int32), axis=1)


@dataclasses.dataclass(frozen=True)
class Walk:
  """Which blocks of the other kind each program visits: programs own
  blocks of ``own`` tokens and step over blocks of ``step`` tokens."""
  own: int                # tokens per program's block
  step: int               # tokens per visited block
  first: np.ndarray       # [programs] the first block visited (static part)
  last: np.ndarray        # [programs] the last block visited (static part)
  steps: int              # the most blocks any program visits


def key_walk(lay: Layout, block_q: int, block_k: int) -> Walk:
  """Query blocks (the forward and dq programs) over key blocks: from the
  first key in some query's window to the diagonal."""
  first_q = np.arange(lay.t_pad // block_q) * block_q
  last = (first_q + block_q - 1) // block_k
  first = (np.zeros_like(first_q) if lay.window is None else
           np.maximum(first_q - (lay.window - 1), 0) // block_k)
  return Walk(block_q, block_k, first, last, int(np.max(last - first)) + 1)


def query_walk(lay: Layout, block_q: int, block_k: int) -> Walk:
  """Key blocks (the dk/dv programs) over query blocks: from the diagonal
  to the last query whose window holds some key of the block."""
  first_k = np.arange(lay.t_pad // block_k) * block_k
  last_q_block = lay.t_pad // block_q - 1
  first = first_k // block_q
  last = (np.full_like(first_k, last_q_block) if lay.window is None else
          np.minimum((first_k + block_k - 1 + lay.window - 1) // block_q,
                     last_q_block))
  return Walk(block_k, block_q, first, last, int(np.max(last - first)) + 1)


def key_bounds(walk: Walk, doc, lay: Layout):
  """int32 ``[B * programs]``: the first key block of each (batch row,
  query block), past the keys of earlier documents."""
  first = jnp.broadcast_to(jnp.asarray(walk.first, jnp.int32),
                           (lay.batch, walk.first.size))
  if doc is not None:
    doc = doc.reshape(lay.batch, lay.t_pad)
    t = jnp.arange(lay.t_pad, dtype=jnp.int32)
    new = jnp.pad(doc[:, 1:] != doc[:, :-1], ((0, 0), (1, 0)),
                  constant_values=True)
    start = jax.lax.cummax(jnp.where(new, t, 0), axis=1)        # [B, T]
    first = jnp.maximum(first, start[:, ::walk.own] // walk.step)
  return first.reshape(-1)


def query_bounds(walk: Walk, doc, lay: Layout):
  """int32 ``[B * programs]``: the last query block of each (batch row,
  key block), before the queries of later documents."""
  last = jnp.broadcast_to(jnp.asarray(walk.last, jnp.int32),
                          (lay.batch, walk.last.size))
  if doc is not None:
    doc = doc.reshape(lay.batch, lay.t_pad)
    t = jnp.arange(lay.t_pad, dtype=jnp.int32)
    ends = jnp.pad(doc[:, 1:] != doc[:, :-1], ((0, 0), (0, 1)),
                   constant_values=True)
    end = jax.lax.cummin(jnp.where(ends, t, lay.t_pad), axis=1,
                         reverse=True)                          # [B, T]
    last = jnp.minimum(last, end[:, walk.own - 1::walk.own] // walk.step)
  return last.reshape(-1)
