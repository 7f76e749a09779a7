"""Pieces shared by the encoder-only mixers: a linear resize of a learnt
bias along time, and a depthwise "same" convolution's parameters."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax.layers import modules


def resize_matrix(size: int, length: int):
  """``[S, T]`` float32: ``x [..., S] @ m`` resizes ``x`` linearly to
  ``T`` samples, PyTorch's ``interpolate(mode="linear",
  align_corners=False)`` (the 1-D form of Agent Attention's bilinear
  resize of its biases)."""
  m = np.zeros((size, length), np.float32)
  src = np.maximum((np.arange(length) + 0.5) * size / length - 0.5, 0.0)
  lo = np.minimum(np.floor(src).astype(int), size - 1)
  hi = np.minimum(lo + 1, size - 1)
  frac = src - lo
  m[lo, np.arange(length)] += 1.0 - frac
  m[hi, np.arange(length)] += frac
  return jnp.asarray(m)


def conv_weight(rngs: nnx.Rngs, channels: int, width: int, param_dtype):
  """A depthwise ``[C, W]`` kernel, PyTorch's default init for a
  ``Conv2d(C, C, W, groups=C)`` (uniform, bound ``1 / sqrt(W)``)."""
  checks_width(width)
  bound = width ** -0.5
  return modules.param(rngs, modules.uniform_init(-bound, bound),
                       (channels, width), ("heads", None), param_dtype)


def checks_width(width: int) -> None:
  """A "same" convolution needs an odd width."""
  if (isinstance(width, bool) or not isinstance(width, int) or width < 1
      or width % 2 == 0):
    raise ValueError(f"a convolution width must be an odd positive int, got "
                     f"{width!r}")
