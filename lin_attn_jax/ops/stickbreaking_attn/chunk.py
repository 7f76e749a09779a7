"""Blockwise stick-breaking attention: the training path.

The sequence is cut into blocks of ``C`` positions; query block ``n`` walks
key blocks ``n, n - 1, ..., 0``, nearest first, carrying per query the
softplus sum of the keys it has walked (``blockwise.py``; the derivation is
in this folder's README). Only the ``N (N + 1) / 2`` block pairs at or below
the diagonal are computed, packed into about ``N / 2`` slots of a
``lax.scan`` as in the softmax family's block-sparse passes. Never forms
``[T, T]``: the backward pass is a ``custom_vjp`` that keeps ``o`` and the
log of the remaining stick and recomputes each block's weights, so memory
is linear in ``T`` in both directions.

``block_size`` changes speed, never results beyond float tolerance.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import context_parallel
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.softmax_attn.chunk import padded_positions
from lin_attn_jax.ops.softmax_attn.inputs import (check_block_size,
                                                  default_scale)
from lin_attn_jax.ops.stickbreaking_attn import context_parallel as split
from lin_attn_jax.ops.stickbreaking_attn.blockwise import (
    stickbreaking_blocks, walk_pairs)
from lin_attn_jax.ops.stickbreaking_attn.inputs import validate


def finish(o, log_rem, length: int, dtype, output_rem: bool):
  """``o [B, T, H, V]`` in ``dtype`` (the first ``length`` rows), and
  ``rem = exp(log_rem)`` in float32 when asked for."""
  o = o[:, :length].astype(dtype)
  return (o, jnp.exp(log_rem[:, :length])) if output_rem else o


@context_parallel.splits_sequence(
    lambda: split.context_parallel_stickbreaking_attn)
def chunk_stickbreaking_attn(q, k, v, *, scale=None, attend_current=False,
                             segment_ids=None, block_size=64,
                             output_rem=False):
  """Blockwise stick-breaking attention; never forms ``[T, T]``.

  Arguments and result as in ``parallel_stickbreaking_attn``, plus:
    block_size: ``C``, query and key positions per block (speed only).

  Example:
    >>> q = jnp.ones((1, 300, 4, 8)); k = v = jnp.ones((1, 300, 2, 8))
    >>> chunk_stickbreaking_attn(q, k, v, block_size=32).shape
    (1, 300, 4, 8)
  """
  b, t, _, _, dk, _ = validate(q, k, v, segment_ids, attend_current)
  check_block_size(block_size)
  c = min(block_size, t)
  n = -(-t // c)
  positions = padded_positions(np.arange(t), c)                 # [N*C]
  doc = (None if segment_ids is None
         else pad_time(document_index(segment_ids, b, t), c, mode="edge"))
  qp, kp, vp = (pad_time(jnp.asarray(x, jnp.float32), c) for x in (q, k, v))
  o, log_rem = stickbreaking_blocks(
      qp, kp, vp, doc, doc, q_pos=positions, k_pos=positions,
      pairs=walk_pairs(range(n), lambda m: range(m, -1, -1)),
      attend_current=attend_current, block_size=c,
      scale=default_scale(scale, dk))
  return finish(o, log_rem, t, v.dtype, output_rem)
