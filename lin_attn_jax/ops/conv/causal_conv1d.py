"""The short depthwise causal convolution (Mamba, H3, DeltaNet, ...).

    y_t = act(sum_{w < W} weight[:, w] * x_{t - W + 1 + w} + bias)

The last tap multiplies the current input. The decoding state is the last
``W - 1`` inputs, oldest first, ``[B, W - 1, D]``; ``initial_state`` holds
the inputs before ``x_0``. With ``segment_ids`` a tap only reads inputs of
the output's own document (the initial state belongs to the first one), and
the final state keeps only inputs of the last document (zeros elsewhere),
exactly as if the step form had been reset at every document start.

Letters: b batch, t time, d channel, w tap.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import checks, context_parallel
from lin_attn_jax.ops.common.chunking import (merge_chunks, pad_time,
                                              split_chunks)
from lin_attn_jax.ops.common.reductions import column_sum
from lin_attn_jax.ops.common.segments import document_index, reset_flags
from lin_attn_jax.ops.conv import context_parallel as split
from lin_attn_jax.ops.conv.inputs import (ACTIVATIONS, finish, validate,
                                         validate_step)

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


def _final_window(padded, doc_padded, taps):
  """The last ``W - 1`` entries, zero where not in the last document."""
  if taps == 1:
    return padded[:, :0]
  last = padded[:, -(taps - 1):]
  same_doc = doc_padded[:, -(taps - 1):] == doc_padded[:, -1:]
  return jnp.where(same_doc[..., None], last, 0.0)


def naive_recurrent_causal_conv1d(x, weight, bias=None, *, activation=None,
                                  initial_state=None, output_final_state=False,
                                  segment_ids=None):
  """Reference: a window of the last W inputs slid one token at a time."""
  batch, length, channels, taps = validate(x, weight, bias, activation,
                                           initial_state, segment_ids)
  weight_f = jnp.asarray(weight, _F32)
  window = initial_window(initial_state, batch, taps, channels)  # [B,W-1,D]
  reset = reset_flags(segment_ids, batch, length)

  def step(window, inputs):
    x_t, reset_t = inputs                                       # [B, D], [B]
    window = jnp.where(reset_t[:, None, None], 0.0, window)
    full = jnp.concatenate([window, x_t[:, None]], axis=1)      # [B, W, D]
    y_t = jnp.sum(full * weight_f.T, axis=1)                    # [B, D]
    return full[:, 1:], y_t

  window, y = jax.lax.scan(
      step, window, (jnp.moveaxis(jnp.asarray(x, _F32), 1, 0), reset.T))
  y = finish(jnp.moveaxis(y, 0, 1), bias, activation)
  return y.astype(x.dtype), (window if output_final_state else None)


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
  final = (_final_window(padded, doc_padded, taps) if output_final_state
           else None)
  return y, final


def _masked_taps(padded, doc_padded, length):
  """``[taps]`` of ``[B, L, D]``: entry ``t`` of tap ``w`` is ``padded[t +
  w]``, zero where it is not in the document of output ``t``."""
  taps = padded.shape[1] - length + 1
  if doc_padded is None:
    return [padded[:, w:w + length] for w in range(taps)]
  doc_out = doc_padded[:, taps - 1:]                            # [B, L]
  return [jnp.where((doc_padded[:, w:w + length] == doc_out)[..., None],
                    padded[:, w:w + length], 0.0) for w in range(taps)]


def _pre_activation(padded, doc_padded, weight, bias):
  taps = weight.shape[1]
  length = padded.shape[1] - taps + 1
  y = sum(tap * weight[:, w]
          for w, tap in enumerate(_masked_taps(padded, doc_padded, length)))
  return y if bias is None else y + bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _conv_act(padded, doc_padded, weight, bias, activation):
  """``act(sum_w weight[:, w] * masked tap w + bias)``, ``[B, L, D]``.

  The gradient is written out: the cotangent before the activation is made
  once (autodiff lets XLA recompute it, and the taps it comes from, inside
  every reduction for the weight), and the weight and bias gradients are
  ``column_sum``s, which XLA:CPU fuses with their products.
  """
  return ACTIVATIONS[activation](_pre_activation(padded, doc_padded, weight,
                                                 bias))


def _conv_act_fwd(padded, doc_padded, weight, bias, activation):
  return (_conv_act(padded, doc_padded, weight, bias, activation),
          (padded, doc_padded, weight, bias))


def _conv_act_bwd(activation, res, g):
  padded, doc_padded, weight, bias = res
  taps = weight.shape[1]
  length = padded.shape[1] - taps + 1
  if activation is None:
    g_pre = g
  else:                                 # every other activation is SiLU
    pre = _pre_activation(padded, doc_padded, weight, bias)
    # silu'(x) = s (1 + x (1 - s)), s = 1 / (1 + exp(-x)), with the
    # division last: XLA then stores this cotangent rather than recompute
    # it (and the taps) inside each of its consumers.
    exp_neg = jnp.exp(-pre)
    sig = 1.0 / (1.0 + exp_neg)
    g_pre = g * (1.0 + pre * (1.0 - sig)) / (1.0 + exp_neg)     # [B, L, D]
  masked = _masked_taps(padded, doc_padded, length)
  d_weight = jnp.stack([column_sum(tap * g_pre) for tap in masked], axis=1)
  d_bias = None if bias is None else column_sum(g_pre).astype(bias.dtype)
  # Output t reads padded[t + w] through tap w (when in its document).
  if doc_padded is not None:
    doc_out = doc_padded[:, taps - 1:]
  d_padded = jnp.zeros(padded.shape, _F32)
  for w in range(taps):
    term = g_pre * weight[:, w]
    if doc_padded is not None:
      term = jnp.where((doc_padded[:, w:w + length] == doc_out)[..., None],
                       term, 0.0)
    d_padded = d_padded + jnp.pad(term, ((0, 0), (w, taps - 1 - w), (0, 0)))
  d_doc = (None if doc_padded is None
           else np.zeros(doc_padded.shape, jax.dtypes.float0))
  return d_padded, d_doc, d_weight.astype(weight.dtype), d_bias


_conv_act.defvjp(_conv_act_fwd, _conv_act_bwd)


def parallel_causal_conv1d(x, weight, bias=None, *, activation=None,
                           initial_state=None, output_final_state=False,
                           segment_ids=None):
  """All positions at once: one shifted, document-masked copy per tap.

  Shapes as in ``chunk_causal_conv1d``.
  """
  batch, length, channels, taps = validate(x, weight, bias, activation,
                                           initial_state, segment_ids)
  window = initial_window(initial_state, batch, taps, channels)
  padded = jnp.concatenate([window, jnp.asarray(x, _F32)], axis=1)
  doc_padded = (None if segment_ids is None else jnp.pad(
      document_index(segment_ids, batch, length), ((0, 0), (taps - 1, 0))))
  y = _conv_act(padded, doc_padded, jnp.asarray(weight, _F32),
                None if bias is None else jnp.asarray(bias, _F32), activation)
  final = None
  if output_final_state:
    final = _final_window(padded, (jnp.zeros(padded.shape[:2], jnp.int32)
                                   if doc_padded is None else doc_padded), taps)
  return y.astype(x.dtype), final


@context_parallel.splits_sequence(
    lambda: split.context_parallel_causal_conv1d)
def chunk_causal_conv1d(x, weight, bias=None, *, activation=None,
                        initial_state=None, output_final_state=False,
                        segment_ids=None, chunk_size=64):
  """Depthwise causal convolution, the training form.

  The taps are summed over the whole sequence at once, one shifted,
  document-masked copy per tap (as in ``parallel_causal_conv1d``): XLA fuses
  the copies into one pass, which on CPU is faster than a ``lax.scan`` over
  chunks carrying the last ``W - 1`` inputs (the chunk axis copies and the
  per-step overhead cost more than the ``W`` taps).

  Args:
    x: ``[B, T, D]``.
    weight: ``[D, W]``, ``1 <= W <= MAX_WIDTH`` (64); the last tap multiplies
      the current input.
    bias: ``[D]``, or None.
    activation: None, ``"silu"`` or ``"swish"``.
    initial_state: ``[B, W - 1, D]`` float32, the inputs before ``x_0``
      (oldest first), or None for zeros.
    output_final_state: also return the last ``W - 1`` inputs.
    segment_ids: ``[B, T]`` int; no tap crosses a change of id.
    chunk_size: kept for the common signature of the chunk forms (checked,
      no effect).
  Returns:
    ``(y [B, T, D] in x's dtype, final_state [B, W - 1, D] float32 or
    None)``.

  Example:
    >>> x = jnp.ones((2, 100, 8)); weight = jnp.ones((8, 4))
    >>> y, s = chunk_causal_conv1d(x, weight, activation="silu",
    ...                            output_final_state=True)
    >>> y.shape, s.shape
    ((2, 100, 8), (2, 3, 8))
  """
  checks.check_chunk_size(chunk_size)
  return parallel_causal_conv1d(x, weight, bias, activation=activation,
                                initial_state=initial_state,
                                output_final_state=output_final_state,
                                segment_ids=segment_ids)


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


def causal_conv1d_step(x, weight, bias=None, state=None, *, activation=None,
                       reset=None):
  """One decoding step, O(W) work.

  Args:
    x: ``[B, D]``; weight: ``[D, W]``; bias: ``[D]`` or None.
    state: ``[B, W - 1, D]`` float32, the last ``W - 1`` inputs, or None.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(y [B, D] in x's dtype, new state [B, W - 1, D] float32)``.
  """
  batch, channels, taps = validate_step(x, weight, bias, activation, state,
                                        reset)
  y, window = conv_step(jnp.asarray(x, _F32), jnp.asarray(weight, _F32),
                        initial_window(state, batch, taps, channels), reset)
  return finish(y, bias, activation).astype(x.dtype), window


def conv_step(x, weight, window, reset):
  """Float32 core of the step: ``(y [B, D], new window [B, W - 1, D])``."""
  if reset is not None:
    window = jnp.where(jnp.asarray(reset)[:, None, None], 0.0, window)
  full = jnp.concatenate([window, x[:, None]], axis=1)          # [B, W, D]
  return jnp.einsum("bwd,dw->bd", full, weight), full[:, 1:]


def recurrent_causal_conv1d(x, weight, bias=None, *, activation=None,
                            initial_state=None, output_final_state=False,
                            segment_ids=None):
  """``causal_conv1d_step`` scanned over time. Shapes as in the chunk form."""
  batch, length, channels, taps = validate(x, weight, bias, activation,
                                           initial_state, segment_ids)
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  weight = jnp.asarray(weight, _F32)
  bias = None if bias is None else jnp.asarray(bias, _F32)

  def step(window, inputs):
    x_t, reset_t = inputs
    y_t, window = causal_conv1d_step(x_t, weight, bias, window,
                                     activation=activation, reset=reset_t)
    return window, y_t

  window, y = jax.lax.scan(
      step, initial_window(initial_state, batch, taps, channels),
      (jnp.moveaxis(x, 1, 0), reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(y, 0, 1), (window if output_final_state else None)
