"""Hardware helpers: the sweep kernels' array layout and its padding.

The kernels walk the chunks of one (batch, head) pair, so the per-chunk
inputs ``[B, N, H, R, F]`` (R rows of a chunk: C tokens, or 1 for the chunk
decay) become ``[B, H, N, R_pad, F_pad]``, with:

- chunk rows zero-padded to the backend's tiles (a multiple of 16 on TPU,
  which bfloat16 packs per sublane tile; a power of two >= 16 on GPU). A
  zero row of ``w``, ``u`` and ``k`` writes nothing to the state, a zero row
  of ``q`` and of ``scores`` reads nothing; padded output rows are cut off;
- feature axes (K, V) zero-padded to a multiple of 128 lanes on TPU and a
  power of two >= 16 on GPU: zero key channels add nothing, padded value
  columns are cut off;
- the state kept transposed, ``[B, H, V, K]``, so that a decay per key
  channel is a row vector ``[1, K]`` that scales the state's columns (a
  row broadcasts on both backends);
- a scalar decay per head broadcast to every key channel (one kernel for
  the three gate kinds; its gradient sums the channels back).

Letters: b batch, n chunk, h head, r row of a chunk, f feature (k key
channel, v value channel), g gate width (1 or K).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallas_kernels.delta_rule.block_sizes import BlockSizes

_F32 = jnp.float32


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _power_of_two_at_least_16(n: int) -> int:
  return max(16, 1 << (n - 1).bit_length())


def padded_features(n: int, backend: str) -> int:
  """Feature width a backend's tiles need for ``n`` channels."""
  return round_up(n, 128) if backend == "tpu" else _power_of_two_at_least_16(n)


def padded_rows(n: int, backend: str) -> int:
  """Chunk rows a backend's tiles need for a chunk of ``n`` tokens."""
  return round_up(n, 16) if backend == "tpu" else _power_of_two_at_least_16(n)


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

  @property
  def v_blocks(self) -> int:
    return self.v_pad // self.block_v


def make_layout(b: int, n: int, h: int, c: int, dk: int, dv: int,
                blocks: BlockSizes) -> Layout:
  backend = blocks.backend
  k_pad, v_pad = padded_features(dk, backend), padded_features(dv, backend)
  block_v = v_pad if blocks.block_v is None else min(blocks.block_v, v_pad)
  if v_pad % block_v:
    raise ValueError(f"block_v ({blocks.block_v}) must divide the padded "
                     f"value width {v_pad} (V = {dv})")
  return Layout(b, n, h, c, dk, dv, padded_rows(c, backend), k_pad, v_pad,
                block_v)


def to_kernel(x, rows_pad: int, f_pad: int, dtype):
  """``[B, N, H, R, F] -> [B, H, N, R_pad, F_pad]``, zero-padded."""
  x = jnp.asarray(x, dtype)
  x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, rows_pad - x.shape[3]),
                  (0, f_pad - x.shape[4])))
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
  state = jnp.asarray(state, _F32)
  state = jnp.pad(state, ((0, 0), (0, 0), (0, lay.k_pad - lay.dim_k),
                          (0, lay.v_pad - lay.dim_v)))
  return jnp.swapaxes(state, 2, 3)


def state_from_kernel(state, lay: Layout):
  """``[B, H, V_pad, K_pad] -> [B, H, K, V]``."""
  return jnp.swapaxes(state, 2, 3)[:, :, :lay.dim_k, :lay.dim_v]


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
