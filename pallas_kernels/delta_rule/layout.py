"""The sweep kernels' array layout and its padding.

The kernels walk the chunks of one (batch, head) pair, so the per-chunk
inputs ``[B, N, H, R, F]`` (R rows of a chunk: C tokens, or 1 for the chunk
decay) become ``[B, H, N, R_pad, F_pad]``, with:

- chunk rows and feature axes zero-padded to the backend's tiles and the
  state kept transposed (``pallas_kernels.common.layout``). A zero row of
  ``w``, ``u`` and ``k`` writes nothing to the state, a zero row of ``q``
  and of ``scores`` reads nothing; padded output rows and value columns are
  cut off;
- a scalar decay per head broadcast to every key channel (one kernel for
  the three gate kinds; its gradient sums the channels back).

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
  block_c: int     # chunk rows per product inside a program

  @property
  def v_blocks(self) -> int:
    return self.v_pad // self.block_v

  @property
  def k_blocks(self) -> int:
    return self.k_pad // self.block_k

  @property
  def c_blocks(self) -> int:
    return self.c_pad // self.block_c


def make_layout(b: int, n: int, h: int, c: int, dk: int, dv: int,
                blocks: BlockSizes) -> Layout:
  backend = blocks.backend
  k_pad, v_pad = padded_features(dk, backend), padded_features(dv, backend)
  block_v = common.feature_blocks(v_pad, blocks.block_v, v_pad, "block_v")
  block_k = common.feature_blocks(k_pad, blocks.block_k, k_pad, "block_k")
  c_pad = padded_rows(c, backend)
  block_c = common.feature_blocks(c_pad, blocks.block_c, c_pad, "block_c")
  return Layout(b, n, h, c, dk, dv, c_pad, k_pad, v_pad, block_v, block_k,
                block_c)


def to_kernel(x, rows_pad: int, f_pad: int, dtype):
  """``[B, N, H, R, F] -> [B, H, N, R_pad, F_pad]``, zero-padded."""
  b, n, h = x.shape[:3]
  x = common.pad_to(x, (b, n, h, rows_pad, f_pad), dtype)
  return jnp.transpose(x, (0, 2, 1, 3, 4))                      # [B,H,N,R,F]


def from_kernel(x, rows: int, f: int):
  """``[B, H, N, R_pad, F_pad] -> [B, N, H, R, F]``."""
  return jnp.transpose(x[:, :, :, :rows, :f], (0, 2, 1, 3, 4))


def decay_to_kernel(decay, lay: Layout):
  """``[B, N, H, G]`` float32 -> ``[B, H, N, 1, K_pad]`` (G = 1 broadcast)."""
  decay = jnp.broadcast_to(jnp.asarray(decay, _F32),
                           decay.shape[:3] + (lay.dim_k,))      # [B,N,H,K]
  return to_kernel(decay[:, :, :, None, :], 1, lay.k_pad, _F32)


def decay_from_kernel(d_decay, lay: Layout, width: int):
  """``[B, H, N, 1, K_pad] -> [B, N, H, width]`` (summed over K for 1)."""
  d_decay = from_kernel(d_decay, 1, lay.dim_k)[:, :, :, 0]      # [B,N,H,K]
  return jnp.sum(d_decay, axis=-1, keepdims=True) if width == 1 else d_decay


def state_to_kernel(state, lay: Layout):
  """``[B, H, K, V]`` float32 -> ``[B, H, V_pad, K_pad]``."""
  return common.state_to_kernel(state, lay.k_pad, lay.v_pad)


def state_from_kernel(state, lay: Layout):
  """``[B, H, V_pad, K_pad] -> [B, H, K, V]``."""
  return common.state_from_kernel(state, lay.dim_k, lay.dim_v)


def kernel_arrays(terms, initial_state, lay: Layout, *, bf16_dots: bool):
  """The kernels' inputs, by name (absent ones left out).

  ``terms``: the ``ChunkTerms`` of ``ops.py`` (``w, q, k: [B, N, H, C, K]``,
  ``u: [B, N, H, C, V]``, ``scores: [B, N, H, C, C]``, ``decay: [B, N, H,
  G]``); ``initial_state: [B, H, K, V]`` or None. Matmul operands are
  stored in bfloat16 when ``bf16_dots``, else in float32; the decay always
  in float32.
  """
  dtype = jnp.bfloat16 if bf16_dots else _F32
  c, k, v = lay.c_pad, lay.k_pad, lay.v_pad
  arrays = {"w": to_kernel(terms.w, c, k, dtype),
            "u": to_kernel(terms.u, c, v, dtype),
            "q": to_kernel(terms.q, c, k, dtype),
            "scores": to_kernel(terms.scores, c, c, dtype),
            "k": to_kernel(terms.k, c, k, dtype),
            "decay": decay_to_kernel(terms.decay, lay)}
  if initial_state is not None:
    arrays["initial_state"] = state_to_kernel(initial_state, lay)
  return arrays
