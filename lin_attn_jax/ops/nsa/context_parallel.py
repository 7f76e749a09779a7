"""Native sparse attention split over a ``sequence`` mesh axis, exactly.

With ``P`` devices each holding ``L = T / P`` tokens:

- compressed and selected branches: a query may select any earlier block
  of its document, so every device gathers the keys and values of the
  whole sequence, and its segment ids (one all-gather of ``[B, T, Hkv, K +
  V]``; its transpose, a reduce-scatter, returns their gradients), finds
  and pools the complete blocks of the whole sequence itself (``O(T (K +
  V))``, cheaper than exchanging them), and runs its own queries at their
  absolute positions against that store (``attention.over_chunks``).
  Each device receives ``(P - 1) L`` tokens of ``Hkv (K + V)`` numbers and
  keeps ``O(T)`` of them;
- window branch: ``softmax_attn``'s own split, a halo of the ``w - 1``
  tokens before each device from its neighbour (one ``ppermute``) where
  ``w - 1 <= L``, else its gathered path.

The gates are elementwise and stay outside both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.nsa import attention, blocks
from lin_attn_jax.ops.nsa.inputs import validate
from lin_attn_jax.ops.softmax_attn.context_parallel import (
    context_parallel_softmax_attn)
from lin_attn_jax.ops.softmax_attn.inputs import default_scale

_F32 = jnp.float32


def _device(split, whole, *, options, axis_name):
  """The compressed and selected branches of this device's queries."""
  del whole
  q, k, v, ids = split
  b, length = q.shape[:2]
  offset = cp.device_index(axis_name) * length
  k_all, v_all = jax.lax.all_gather((k, v), axis_name, axis=1, tiled=True)
  ids_all = (None if ids is None
             else jax.lax.all_gather(ids, axis_name, axis=1, tiled=True))
  total = k_all.shape[1]
  doc_start = jax.lax.dynamic_slice_in_dim(
      blocks.document_start(ids_all, b, total), offset, length, axis=1)
  positions = jnp.broadcast_to(
      offset + jnp.arange(length, dtype=jnp.int32), (b, length))
  return attention.sparse_branches(q, k_all, v_all, ids_all,
                                   positions=positions, doc_start=doc_start,
                                   **options), None


def context_parallel_nsa(q, k, v, g_cmp, g_slc, g_swa=None, *, block_size=64,
                         block_counts=16, window_size=None, scale=None,
                         segment_ids=None, chunk_size=None,
                         axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_nsa`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_nsa``, plus ``axis_name`` (T a
  multiple of its size) and ``mesh`` (None for the current one).
  ``chunk_nsa`` calls this itself when the current mesh has a
  ``"sequence"`` axis of size > 1.
  """
  gates = (g_cmp, g_slc, g_swa)
  _, t, _, _, dk, _ = validate(q, k, v, gates, segment_ids,
                               block_size=block_size,
                               block_counts=block_counts,
                               window_size=window_size)
  checks.positive_int("chunk_size", chunk_size, allow_none=True)
  cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  scale = default_scale(scale, dk)
  options = dict(block_size=block_size, block_counts=block_counts,
                 scale=scale, chunk_size=chunk_size)

  def device(split, whole):
    return _device(split, whole, options=options, axis_name=axis_name)

  o_cmp, o_slc = cp.map_sequence(device, (q, k, v, segment_ids), None,
                                 axis_name=axis_name, mesh=mesh)[0]
  o_swa = None
  if window_size is not None:
    o_swa = context_parallel_softmax_attn(
        *(jnp.asarray(x, _F32) for x in (q, k, v)), scale=scale,
        window_size=window_size, segment_ids=segment_ids,
        block_size=128 if chunk_size is None else chunk_size,
        axis_name=axis_name, mesh=mesh)
  return blocks.mix((o_cmp, o_slc, o_swa), gates, v.dtype)
