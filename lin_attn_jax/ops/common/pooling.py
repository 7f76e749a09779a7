"""Pooling along time, same-padded depthwise convolutions and the
one-document check of the encoder-only mixers (Agent Attention,
Nystromformer, EfficientViT's multi-scale linear attention)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import checks, context_parallel
from lin_attn_jax.ops.common.segments import document_index

_F32 = jnp.float32


def mean_pool_matrix(length: int, n: int):
  """``[n, T]`` float32: row ``i`` averages tokens ``floor(i T / n)`` to
  ``ceil((i + 1) T / n) - 1``, PyTorch's adaptive average pooling (the
  segment means of ``T / n`` tokens each when ``n`` divides ``T``; a token
  repeated when ``n > T``)."""
  m = np.zeros((n, length), np.float32)
  for i in range(n):
    lo, hi = (i * length) // n, -(-((i + 1) * length) // n)
    m[i, lo:hi] = 1.0 / (hi - lo)
  return jnp.asarray(m)


def mean_pool(x, n: int):
  """``[B, n, ...]`` float32 means of ``x [B, T, ...]`` over ``n`` segments
  of its time axis (``mean_pool_matrix``)."""
  pool = mean_pool_matrix(x.shape[1], n)                        # [n, T]
  return jnp.einsum("nt,bt...->bn...", pool, x,
                    preferred_element_type=_F32)                # [B, n, ...]


def same_depthwise_conv(x, weight, *, bias=None, segment_ids=None):
  """Centred depthwise convolution along time, zero-padded ("same").

  ``y_t[c] = sum_j weight[c, j] x_{t + j - W // 2}[c] (+ bias[c])``, taps
  outside the row or outside ``t``'s document (``segment_ids``) read 0: the
  1-D form of a ``Conv2d(C, C, W, padding=W // 2, groups=C)``.

  Args:
    x: ``[B, T, C]``. weight: ``[C, W]``, ``W`` odd. bias: ``[C]`` or None.
    segment_ids: ``[B, T]`` or None.
  Returns:
    ``[B, T, C]`` float32.
  """
  b, t, c = checks.shape_of(x)
  checks.check_rank("weight", weight, 2, "[C, W]")
  w = checks.shape_of(weight)[1]
  if checks.shape_of(weight)[0] != c or w % 2 == 0:
    raise ValueError(f"weight must have shape [C, W] with C = {c} and W odd, "
                     f"got {checks.shape_of(weight)}")
  half = w // 2
  xf = jnp.pad(jnp.asarray(x, _F32), ((0, 0), (half, half), (0, 0)))
  wf = jnp.asarray(weight, _F32)
  if segment_ids is not None:
    checks.check_segment_ids(segment_ids, b, t)
    doc = jnp.pad(document_index(segment_ids, b, t), ((0, 0), (half, half)),
                  constant_values=-1)                           # [B, T + W - 1]
  y = jnp.zeros((b, t, c), _F32)
  for j in range(w):
    tap = xf[:, j:j + t] * wf[:, j]                             # [B, T, C]
    if segment_ids is not None:
      same = doc[:, j:j + t] == doc[:, half:half + t]           # [B, T]
      tap = jnp.where(same[..., None], tap, 0.0)
    y = y + tap
  if bias is not None:
    y = y + jnp.asarray(bias, _F32)
  return y


def multi_document_rows(segment_ids, batch: int, length: int, message: str):
  """The rows of ``segment_ids`` holding more than one document, for an op
  whose tokens mix the whole row.

  None when ``segment_ids`` is None or concrete with one document per row;
  concrete with more raises ``ValueError(message)``; traced: ``[B]`` bool,
  True where a row holds more than one document (the op fills those rows
  with NaN, so that the error shows under ``jit``).
  """
  if segment_ids is None:
    return None
  checks.check_segment_ids(segment_ids, batch, length)
  values = checks.concrete(segment_ids)
  if values is not None:
    if np.any(values[:, 1:] != values[:, :-1]):
      raise ValueError(message)
    return None
  ids = jnp.asarray(segment_ids)
  return jnp.any(ids[:, 1:] != ids[:, :-1], axis=1)


def poison_rows(o, rows):
  """``o [B, ...]`` with NaN in the rows where ``rows [B]`` is True (None:
  ``o``)."""
  if rows is None:
    return o
  return jnp.where(rows.reshape((-1,) + (1,) * (o.ndim - 1)), jnp.nan, o)


def whole_row_inputs(name: str, q, k, v, *, segment_ids, causal: bool,
                     pooled: str):
  """The checks of an attention op whose every token reads a pooling of
  the whole row (Agent Attention, Nystromformer); returns ``(shape,
  bad_rows)``: q's ``(B, T, H, K)`` and ``multi_document_rows``.

  ``name`` names the op in the errors, ``pooled`` says what it pools
  ("its landmarks are means of queries and keys"): ``causal=True``, a
  current mesh's ``"sequence"`` axis of more than one device and
  concrete ``segment_ids`` with more than one document in a row raise
  ``ValueError``.
  """
  if causal:
    raise ValueError(
        f"{name} has no causal form: {pooled} over the whole row, the "
        "future tokens included. Use causal=False (encoder-style "
        "attention).")
  parts = context_parallel.sequence_parallel_size()
  if parts > 1:
    raise ValueError(
        f"{name} cannot split the sequence over the {parts} devices of "
        f"mesh axis 'sequence': {pooled} over the whole sequence. Use a "
        "mesh without a 'sequence' axis (or of size 1).")
  checks.check_qkv(q, k, v)
  shape = checks.shape_of(q)
  bad_rows = multi_document_rows(
      segment_ids, shape[0], shape[1],
      f"{name} takes one document per row: {pooled} over fixed stretches "
      "of the row, across document boundaries, so packed documents would "
      "see each other; segment_ids must be constant along each row")
  return shape, bad_rows
