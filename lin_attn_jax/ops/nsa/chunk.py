"""Native sparse attention blockwise: the training path; never ``[T, T]``.

The sequence itself is the store of ``attention.py``: its complete blocks
(at most ``N = T // l``) are found and mean-pooled once, ``O(T (K + V))``;
the compressed and selected branches then run over chunks of queries
(``attention.over_chunks``), and the window branch is the blockwise
sliding-window form of ``softmax_attn``. Work: ``T N H (K + V)`` for the
compressed branch (``T^2 / l``), ``T n l H (K + V)`` for the selected one,
``T w H (K + V)`` for the window; memory linear in ``T`` in the forward
and the backward, the chunks being rematerialised.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common import context_parallel
from lin_attn_jax.ops.nsa import attention, blocks
from lin_attn_jax.ops.nsa import context_parallel as split
from lin_attn_jax.ops.nsa.inputs import validate
from lin_attn_jax.ops.softmax_attn.chunk import chunk_softmax_attn
from lin_attn_jax.ops.softmax_attn.inputs import default_scale

_F32 = jnp.float32


@context_parallel.splits_sequence(lambda: split.context_parallel_nsa)
def chunk_nsa(q, k, v, g_cmp, g_slc, g_swa=None, *, block_size=64,
              block_counts=16, window_size=None, scale=None, segment_ids=None,
              chunk_size=None):
  """Native sparse attention, blockwise; never forms ``[T, T]``.

  Arguments and result as in ``parallel_nsa``, plus:
    chunk_size: queries per chunk of the compressed and selected branches,
      and positions per block of the window branch (speed only; None: as
      many queries as keep a chunk's gathered blocks near
      ``chunking.GROUP_FLOATS`` floats, and blocks of 128 for the window).

  Example:
    >>> q = jnp.ones((1, 50, 4, 8)); k = v = jnp.ones((1, 50, 2, 8))
    >>> g = jnp.full((1, 50, 4), 0.5)
    >>> chunk_nsa(q, k, v, g, g, g, block_size=4, block_counts=3,
    ...           window_size=8, chunk_size=16).shape
    (1, 50, 4, 8)
  """
  gates = (g_cmp, g_slc, g_swa)
  *_, dk, _ = validate(q, k, v, gates, segment_ids, block_size=block_size,
                       block_counts=block_counts, window_size=window_size)
  checks.positive_int("chunk_size", chunk_size, allow_none=True)
  scale = default_scale(scale, dk)
  o_cmp, o_slc = attention.sparse_branches(
      q, k, v, segment_ids, block_size=block_size, block_counts=block_counts,
      scale=scale, chunk_size=chunk_size)
  o_swa = None
  if window_size is not None:
    o_swa = chunk_softmax_attn(
        *(jnp.asarray(x, _F32) for x in (q, k, v)), scale=scale,
        window_size=window_size, segment_ids=segment_ids,
        block_size=128 if chunk_size is None else chunk_size)
  return blocks.mix((o_cmp, o_slc, o_swa), gates, v.dtype)
