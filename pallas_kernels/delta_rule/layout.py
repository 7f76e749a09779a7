"""The sweep kernels' array layout and its padding.

The kernels walk the chunks of one (batch, head) pair, so the per-chunk
inputs ``[B, N, H, R, F]`` (R rows of a chunk: C tokens, or 1 for the chunk
decay) become ``[B, H, N, R_pad, F_pad]``, with chunk rows and feature axes
zero-padded to the backend's tiles and the state kept transposed
(``pallas_kernels.common.layout``). A zero row or key column of ``M1``,
``M2`` and ``E_b`` and a zero value column of ``a`` and ``E_a`` add
nothing to ``y`` or to the state, so padded rows and columns of the
kernels' outputs are zero; they are cut off. A scalar decay per head is
broadcast to every key channel (one kernel for the three gate kinds; its
gradient sums the channels back).

Letters: b batch, n chunk, h head, r row of a chunk, f feature (k key
channel, v value channel), g gate width (1 or K).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallas_kernels.common import layout as common
from pallas_kernels.delta_rule.block_sizes import BlockSizes

_F32 = jnp.float32
padded_features = common.padded_features
padded_rows = common.padded_rows


@dataclasses.dataclass(frozen=True)
class Layout:
  """Sizes of one call, before and after padding."""
  batch: int       # B
  chunks: int      # N
  heads: int       # H
  chunk: int       # C, tokens per chunk
  dim_k: int       # K
  dim_v: int       # V
  c_pad: int       # C padded to the backend's tiles
  k_pad: int       # K padded to the backend's tiles
  v_pad: int       # V padded to the backend's tiles
  block_v: int     # value columns per program
  block_k: int     # key columns per product inside a program

  @property
  def v_blocks(self) -> int:
    return self.v_pad // self.block_v

  @property
  def k_blocks(self) -> int:
    return self.k_pad // self.block_k


def make_layout(b: int, n: int, h: int, c: int, dk: int, dv: int,
                blocks: BlockSizes) -> Layout:
  backend = blocks.backend
  k_pad, v_pad = padded_features(dk, backend), padded_features(dv, backend)
  block_v = common.feature_blocks(v_pad, blocks.block_v, v_pad, "block_v")
  block_k = common.feature_blocks(k_pad, blocks.block_k, k_pad, "block_k")
  return Layout(b, n, h, c, dk, dv, padded_rows(c, backend), k_pad, v_pad,
                block_v, block_k)


def to_kernel(x, rows_pad: int, f_pad: int, dtype=_F32):
  """``[B, N, H, R, F] -> [B, H, N, R_pad, F_pad]``, zero-padded."""
  b, n, h = x.shape[:3]
  x = common.pad_to(x, (b, n, h, rows_pad, f_pad), dtype)
  return jnp.transpose(x, (0, 2, 1, 3, 4))                      # [B,H,N,R,F]


def from_kernel(x, rows: int, f: int):
  """``[B, H, N, R_pad, F_pad] -> [B, N, H, R, F]``."""
  return jnp.transpose(x[:, :, :, :rows, :f], (0, 2, 1, 3, 4))


def rows_to_kernel(x, lay: Layout, dtype=_F32):
  """Chunk rows with key columns, ``[B, N, H, C, K] -> [B, H, N, C_pad,
  K_pad]``."""
  return to_kernel(x, lay.c_pad, lay.k_pad, dtype)


def values_to_kernel(x, lay: Layout, dtype=_F32):
  """Chunk rows with value columns, ``[B, N, H, C, V] -> [B, H, N, C_pad,
  V_pad]``."""
  return to_kernel(x, lay.c_pad, lay.v_pad, dtype)


def values_from_kernel(x, lay: Layout):
  """``[B, H, N, C_pad, V_pad] -> [B, N, H, C, V]``."""
  return from_kernel(x, lay.chunk, lay.dim_v)


def decay_to_kernel(decay, lay: Layout):
  """``[B, N, H, G]`` float32 -> ``[B, H, N, 1, K_pad]`` (G = 1 broadcast)."""
  decay = jnp.broadcast_to(jnp.asarray(decay, _F32),
                           decay.shape[:3] + (lay.dim_k,))      # [B,N,H,K]
  return to_kernel(decay[:, :, :, None, :], 1, lay.k_pad, _F32)


def states_from_kernel(states, lay: Layout):
  """Per-chunk states ``[B, H, N, V_pad, K_pad] -> [B, H, N, V, K]`` (still
  transposed, head-major)."""
  return states[:, :, :, :lay.dim_v, :lay.dim_k]


def state_to_kernel(state, lay: Layout):
  """``[B, H, K, V]`` float32 -> ``[B, H, V_pad, K_pad]``."""
  return common.state_to_kernel(state, lay.k_pad, lay.v_pad)


def state_from_kernel(state, lay: Layout):
  """``[B, H, V_pad, K_pad] -> [B, H, K, V]``."""
  return common.state_from_kernel(state, lay.dim_k, lay.dim_v)
