"""Padding a sequence to whole chunks and splitting it into chunks."""

from __future__ import annotations

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
