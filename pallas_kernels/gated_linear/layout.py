"""The kernels' array layout, padding and tiling.

The kernels walk one (batch, head) pair along time, so the public layout
``[B, T, H, F]`` becomes ``[B, H, T, F]``, with (``pallas_kernels.common.
layout``) feature axes zero-padded to the backend's tiles and the state
kept transposed, ``[B, H, V, K]``, and:

- time zero-padded to whole chunks: a zero key adds nothing to the state and
  a zero log-decay decays nothing; document indices repeat the last one, so
  padding never starts a document;
- per-token scalars that a kernel needs along lanes given as rows
  ``[.., T / c, 1, c]`` (one row per sub-chunk), so that no kernel
  transposes: the document index (also given as a column ``[.., T, 1]``) and
  a scalar log-decay;
- each program owning a block of key columns and a block of value columns
  (``Tiles``): its state block is ``[block_v, block_k]``. Every sum over key
  columns (the outputs, ``dv``) and over value columns (``dq``, ``dk``)
  comes back as one part per block, which XLA adds.

Letters: b batch, t time, h head, f feature (k key channel, v value
channel, g gate width: 1 or K), c tokens per sub-chunk.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallas_kernels.common import layout as common
from pallas_kernels.gated_linear.block_sizes import BlockSizes

_F32 = jnp.float32
round_up = common.round_up


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Feature columns per program of one pass."""
  block_k: int     # key columns per program
  block_v: int     # value columns per program
  k_blocks: int    # K_pad / block_k
  v_blocks: int    # V_pad / block_v


@dataclasses.dataclass(frozen=True)
class Layout:
  """Sizes of one call, before and after padding."""
  batch: int       # B
  length: int      # T
  heads: int       # H
  dim_k: int       # K
  dim_v: int       # V
  t_pad: int       # T rounded up to whole chunks
  k_pad: int       # K padded to the backend's tiles
  v_pad: int       # V padded to the backend's tiles
  chunk: int       # tokens per grid step (TPU) and between checkpoints
  sub_chunk: int   # c
  forward: Tiles   # the forward kernel's programs
  backward: Tiles  # the backward kernels' programs


def _tiles(blocks: BlockSizes, direction: str, k_pad: int, v_pad: int):
  # A block given must divide the padded width; a default one is halved
  # until it does (256 -> 128 for Based's 273 key channels, 384 lanes).
  given = ((blocks.block_k, blocks.block_v) if direction == "forward" else
           (blocks.backward_block_k, blocks.backward_block_v))
  block_k, block_v = blocks.features(direction)
  prefix = "" if direction == "forward" else "backward_"
  bk = common.feature_blocks(k_pad, given[0], block_k, prefix + "block_k")
  bv = common.feature_blocks(v_pad, given[1], block_v, prefix + "block_v")
  return Tiles(bk, bv, k_pad // bk, v_pad // bv)


def make_layout(b: int, t: int, h: int, dk: int, dv: int,
                blocks: BlockSizes) -> Layout:
  c = blocks.sub_chunk_rows
  # A sequence shorter than a chunk needs only enough whole sub-chunks.
  chunk = min(blocks.chunk, round_up(t, c))
  k_pad = common.padded_features(dk, blocks.backend)
  v_pad = common.padded_features(dv, blocks.backend)
  return Layout(b, t, h, dk, dv, round_up(t, chunk), k_pad, v_pad, chunk, c,
                _tiles(blocks, "forward", k_pad, v_pad),
                _tiles(blocks, "backward", k_pad, v_pad))


def to_kernel(x, lay: Layout, f_pad: int, dtype=None):
  """``[B, T, H, F] -> [B, H, T_pad, F_pad]``, zero-padded."""
  b, _, h, _ = x.shape
  x = common.pad_to(x, (b, lay.t_pad, h, f_pad), dtype)
  return jnp.transpose(x, (0, 2, 1, 3))                        # [B, H, T, F]


def from_kernel(x, lay: Layout, f: int):
  """``[B, H, T_pad, F_pad] -> [B, T, H, F]``."""
  return jnp.transpose(x[:, :, :lay.length, :f], (0, 2, 1, 3))


def rows(column, c: int):
  """``[..., T_pad, 1] -> [..., T_pad / c, 1, c]``: one row per sub-chunk."""
  *lead, t, _ = column.shape
  return column.reshape(*lead, t // c, 1, c)


def document_columns(doc, lay: Layout):
  """Document index of each token and of the token before it.

  ``doc: [B, T]`` float32 (0 for the first document, +1 at every change).
  Returns ``(doc [B, T_pad, 1], doc_prev [B, T_pad, 1])``; ``doc_prev`` at
  t = 0 is 0, the document of the initial state.
  """
  doc, prev = common.documents(doc, lay.t_pad)
  return doc[..., None], prev[..., None]


def state_to_kernel(state, lay: Layout):
  """``[B, H, K, V]`` float32 -> ``[B, H, V_pad, K_pad]``."""
  return common.state_to_kernel(state, lay.k_pad, lay.v_pad)


def state_from_kernel(state, lay: Layout):
  """``[B, H, V_pad, K_pad] -> [B, H, K, V]``."""
  return common.state_from_kernel(state, lay.dim_k, lay.dim_v)


def kernel_arrays(q, k, v, g, initial_state, doc, lay: Layout, *,
                  bf16_dots: bool, do=None, d_final=None):
  """The kernels' inputs, by name (absent ones left out).

  ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, ``g: [B, T, H, G]`` float32
  or None, ``initial_state: [B, H, K, V]`` or None, ``doc: [B, T]`` float32
  or None; ``do: [B, T, H, V]`` and ``d_final: [B, H, K, V]`` for the
  backward kernels.
  """
  dtype = jnp.bfloat16 if bf16_dots else _F32
  arrays = {"q": to_kernel(q, lay, lay.k_pad, dtype),
            "k": to_kernel(k, lay, lay.k_pad, dtype),
            "v": to_kernel(v, lay, lay.v_pad, dtype)}
  if g is not None and g.shape[-1] == 1:
    arrays["gate_row"] = rows(to_kernel(g, lay, 1, _F32), lay.sub_chunk)
  elif g is not None:
    arrays["gate"] = to_kernel(g, lay, lay.k_pad, _F32)         # [B, H, T, K]
  if doc is not None:
    arrays["doc"], arrays["doc_prev"] = document_columns(doc, lay)
    arrays["doc_row"] = rows(arrays["doc"], lay.sub_chunk)
  if initial_state is not None:
    arrays["initial_state"] = state_to_kernel(initial_state, lay)
  if do is not None:
    arrays["do"] = to_kernel(do, lay, lay.v_pad, dtype)
  if d_final is not None:
    arrays["d_final"] = state_to_kernel(d_final, lay)
  return arrays
