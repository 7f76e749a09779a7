"""Padding and layout shared by the kernel packages.

- Feature axes (K, V) are zero-padded to the backend's tiles: whole
  128-lane tiles on TPU, a power of two >= 16 on GPU (Triton tiles have
  power-of-two sizes and ``tl.dot`` needs 16 or more). Zero query and key
  channels add nothing; padded value columns are cut off the outputs.
- Row axes (tokens of a chunk) to a multiple of 16 on TPU (bfloat16 packs
  16 rows per sublane tile) and a power of two >= 16 on GPU.
- States are kept transposed, ``[B, H, V, K]``, so that a decay per key
  channel is a row ``[1, K]`` that scales the state's columns (a row
  broadcasts on both backends).
- A feature axis is split into blocks of ``block`` columns, one per program
  (``feature_blocks``); a sum over that axis comes back as one part per block
  with a leading axis, which XLA adds (``sum_parts``).

Letters: b batch, h head, k key channel, v value channel.
"""

from __future__ import annotations

import jax.numpy as jnp

_F32 = jnp.float32


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def power_of_two_at_least_16(n: int) -> int:
  return max(16, 1 << (n - 1).bit_length())


def padded_features(n: int, backend: str) -> int:
  """Feature width a backend's tiles need for ``n`` channels."""
  return round_up(n, 128) if backend == "tpu" else power_of_two_at_least_16(n)


def padded_rows(n: int, backend: str) -> int:
  """Rows a backend's tiles need for ``n`` tokens."""
  return round_up(n, 16) if backend == "tpu" else power_of_two_at_least_16(n)


def feature_blocks(padded: int, block: int | None, default: int,
                   name: str) -> int:
  """The tile of an axis ``padded`` long (feature columns per program, or
  rows or columns per product): ``block``, at most ``padded``, which must
  divide ``padded``; or with ``block`` None, ``default`` halved until it
  divides ``padded`` (256 -> 128 for 384 lanes)."""
  width = min(default if block is None else block, padded)
  if block is None:
    while padded % width:
      width //= 2
  if padded % width:
    raise ValueError(f"{name} ({block}) must divide the padded width "
                     f"{padded}")
  return width


def pad_to(x, shape, dtype=None):
  """``x`` zero-padded at the end of every axis to ``shape``."""
  x = jnp.asarray(x) if dtype is None else jnp.asarray(x, dtype)
  return jnp.pad(x, [(0, n - m) for n, m in zip(shape, x.shape)])


def documents(doc, t_pad: int):
  """``(doc, before)`` ``[B, T_pad]`` float32: the document index of each
  token (``doc [B, T]``: 0 for the first document, +1 at every change;
  padding continues the last document) and of the token before it (0 at
  t = 0, the document of the initial state)."""
  doc = jnp.asarray(doc, _F32)
  doc = jnp.pad(doc, ((0, 0), (0, t_pad - doc.shape[1])), mode="edge")
  return doc, jnp.pad(doc, ((0, 0), (1, 0)))[:, :-1]


def state_to_kernel(state, k_pad: int, v_pad: int):
  """``[B, H, K, V]`` float32 -> ``[B, H, V_pad, K_pad]``."""
  b, h = state.shape[:2]
  return jnp.swapaxes(pad_to(state, (b, h, k_pad, v_pad), _F32), 2, 3)


def state_from_kernel(state, dim_k: int, dim_v: int):
  """``[B, H, V_pad, K_pad] -> [B, H, K, V]``."""
  return jnp.swapaxes(state, 2, 3)[:, :, :dim_k, :dim_v]


def sum_parts(x):
  """Adds the parts of a sum that programs owning different feature blocks
  return along the leading axis (free for one part)."""
  return x[0] if x.shape[0] == 1 else jnp.sum(x, axis=0)
