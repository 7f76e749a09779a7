"""Causal convolution algorithms shared by the conv forms and H3's shift
SSM: the window of past inputs, the shifted-sum and Toeplitz products, one
step."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import (merge_chunks, pad_time,
                                              split_chunks)

_F32 = jnp.float32


def initial_window(initial_state, batch, taps, channels):
  """The float32 ``[B, W - 1, D]`` window to start from (zeros when None)."""
  if initial_state is None:
    return jnp.zeros((batch, taps - 1, channels), _F32)
  return jnp.asarray(initial_state, _F32)


def _shifted_sum(padded, doc_padded, weight, length):
  """``sum_w weight[:, w] * padded[t + w]`` over taps of the same document.

  Args:
    padded: ``[B, W - 1 + L, D]`` float32, the ``W - 1`` inputs before the
      block followed by the block.
    doc_padded: ``[B, W - 1 + L]`` document index of every entry.
    weight: ``[D, W]`` float32.
  Returns:
    ``[B, L, D]``.
  """
  taps = weight.shape[1]
  doc_out = doc_padded[:, taps - 1:]                            # [B, L]
  y = jnp.zeros(padded.shape[:1] + (length,) + padded.shape[2:], _F32)
  for w in range(taps):
    same_doc = (doc_padded[:, w:w + length] == doc_out)[..., None]
    y = y + jnp.where(same_doc, padded[:, w:w + length], 0.0) * weight[:, w]
  return y


def final_window(padded, doc_padded, taps):
  """The last ``W - 1`` entries, zero where not in the last document."""
  if taps == 1:
    return padded[:, :0]
  last = padded[:, -(taps - 1):]
  same_doc = doc_padded[:, -(taps - 1):] == doc_padded[:, -1:]
  return jnp.where(same_doc[..., None], last, 0.0)


def shifted_sum_conv(x, weight, window, doc, output_final_state):
  """Float32 core of the parallel form: ``(y [B, T, D], final or None)``.

  Args:
    x: ``[B, T, D]``; weight: ``[D, W]``; window: ``[B, W - 1, D]``;
    doc: ``[B, T]`` document indices (the window belongs to document 0).
  """
  taps = weight.shape[1]
  padded = jnp.concatenate([window, x], axis=1)                 # [B, W-1+T, D]
  doc_padded = jnp.pad(doc, ((0, 0), (taps - 1, 0)))
  y = _shifted_sum(padded, doc_padded, weight, x.shape[1])
  final = (final_window(padded, doc_padded, taps) if output_final_state
           else None)
  return y, final


def toeplitz_conv(x, weight, window, chunk_size, output_final_state):
  """The convolution as matmuls: per chunk and channel, a ``[L, L]`` Toeplitz
  matrix of the taps times the chunk, plus one times the previous chunk.

  For wide kernels (H3's shift SSM, up to ``MAX_WIDTH`` taps), where the
  tap-by-tap sum of ``shifted_sum_conv`` costs ``W`` passes over the data and
  as many operations to compile. The chunk length is at least ``W - 1``, so
  every tap reaches back one chunk at most. Work is ``O(T D L)``. One
  document: masking the products per document would hold a ``[B, T / L,
  D, L, L]`` product, slower than ``shifted_sum_conv``'s masked taps.
  Arguments as in ``shifted_sum_conv``, without ``doc``.
  """
  batch, length, channels = x.shape
  taps = weight.shape[1]
  chunk = max(min(chunk_size, length), taps - 1, 1)
  by_lag = jnp.flip(weight, axis=1)                             # [D, W]: lag l
  pos = jnp.arange(chunk)
  lags = jnp.arange(taps)
  # own[d, t, s] = weight at lag t - s; prev: lag t + L - s from the chunk
  # before.
  own_lag = (pos[:, None] - pos[None, :])[..., None] == lags     # [L, L, W]
  prev_lag = (pos[:, None] + chunk - pos[None, :])[..., None] == lags
  own = jnp.einsum("dl,tsl->dts", by_lag, own_lag.astype(_F32))  # [D, L, L]
  prev = jnp.einsum("dl,tsl->dts", by_lag, prev_lag.astype(_F32))
  x_c = split_chunks(pad_time(x, chunk), chunk)                 # [B, M, L, D]
  first_prev = jnp.pad(window, ((0, 0), (chunk - taps + 1, 0), (0, 0)))
  x_prev = jnp.concatenate([first_prev[:, None], x_c[:, :-1]], axis=1)
  y = (jnp.einsum("dts,bmsd->bmtd", own, x_c)
       + jnp.einsum("dts,bmsd->bmtd", prev, x_prev))            # [B, M, L, D]
  y = merge_chunks(y)[:, :length]
  final = None
  if output_final_state:
    # The last W - 1 inputs (from the window where x is shorter).
    padded = jnp.concatenate([window, x[:, max(0, length - taps + 1):]], axis=1)
    final = padded[:, padded.shape[1] - (taps - 1):]
  return y, final


def conv_step(x, weight, window, reset):
  """Float32 core of the step: ``(y [B, D], new window [B, W - 1, D])``."""
  if reset is not None:
    window = jnp.where(jnp.asarray(reset)[:, None, None], 0.0, window)
  full = jnp.concatenate([window, x[:, None]], axis=1)          # [B, W, D]
  return jnp.einsum("bwd,dw->bd", full, weight), full[:, 1:]
