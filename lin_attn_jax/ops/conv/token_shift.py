"""Token shift: the previous token of every position (RWKV).

``shifted_t = x_{t-1}``, with ``first`` (the token before ``x_0``, from a
cache) or zeros at ``t = 0``, and zeros at the start of every document. A
causal convolution of one tap in the past; under a mesh with a
``"sequence"`` axis of size > 1 each device takes its first entry from the
last token of the previous device (``context_parallel_token_shift``).
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks, context_parallel
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.conv import context_parallel as split


def check_shift(x, first, segment_ids):
  """Validates ``x [B, T, C]``, ``first [B, C]`` or None and segment ids."""
  checks.check_rank("x", x, 3, "[B, T, C]")
  checks.check_float("x", x)
  batch, length, channels = checks.shape_of(x)
  if first is not None:
    checks.check_shape("first", first, (batch, channels), "[B, C]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, channels


def shift_with(x, previous, starts):
  """``[previous, x_0, ..., x_{T-2}]``, zero where ``starts [B, T]``.

  ``previous: [B, 1, C]``; ``starts`` None for no document starts.
  """
  shifted = jnp.concatenate([previous.astype(x.dtype), x[:, :-1]], axis=1)
  if starts is None:
    return shifted
  return jnp.where(starts[..., None], jnp.zeros_like(shifted), shifted)


@context_parallel.splits_sequence(
    lambda: split.context_parallel_token_shift)
def token_shift(x, first=None, segment_ids=None):
  """The previous token of every position.

  Args:
    x: ``[B, T, C]``.
    first: ``[B, C]``, the token before ``x_0``, or None for zeros.
    segment_ids: ``[B, T]`` int; the previous token is zero where a document
      starts.
  Returns:
    ``[B, T, C]`` in x's dtype.
  """
  batch, length, channels = check_shift(x, first, segment_ids)
  previous = (jnp.zeros((batch, 1, channels), x.dtype) if first is None
              else jnp.asarray(first)[:, None])
  starts = (None if segment_ids is None
            else reset_flags(segment_ids, batch, length))
  return shift_with(x, previous, starts)
