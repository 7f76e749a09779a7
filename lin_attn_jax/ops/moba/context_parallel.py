"""MoBA split over a ``sequence`` mesh axis, exactly.

A query may select any earlier block of its document, wherever it lies, so
every device needs the keys of the whole sequence: it all-gathers the keys,
values and segment ids (``(P - 1) T / P`` tokens of ``Hkv (K + V)`` numbers
and one id each; the transpose, a reduce-scatter, returns the keys' and
values' gradients), recomputes the block means of the whole sequence from
the gathered keys (``O(T K)``: blocks follow documents, not devices, so
per-device block sums would not line up) and runs the blockwise form on its
own queries (``chunk.blockwise_moba``, offset by its first position): the
own-block pass reads the ``C - 1`` gathered keys before its first query,
the selected-block pass the gathered full blocks. As with full softmax
attention (``softmax_attn/context_parallel.py``), the gathered keys and
values cost ``O(T)`` memory per device; the work per device is its own
queries' share. ``top_k = 1`` (causal attention) is the softmax family's
split.
"""

from __future__ import annotations

import jax

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.moba import blocks, chunk
from lin_attn_jax.ops.moba.inputs import validate
from lin_attn_jax.ops.softmax_attn.context_parallel import (
    context_parallel_softmax_attn)
from lin_attn_jax.ops.softmax_attn.inputs import default_scale


def context_parallel_moba(q, k, v, *, block_size: int, top_k: int,
                          scale=None, segment_ids=None, chunk_size: int = 64,
                          axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_moba`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_moba``, plus ``axis_name`` (T a
  multiple of its size) and ``mesh`` (None for the current one).
  ``chunk_moba`` calls this itself when the current mesh has a
  ``"sequence"`` axis of size > 1.
  """
  b, t, _, _, dk, _ = validate(q, k, v, segment_ids, block_size, top_k)
  checks.positive_int("chunk_size", chunk_size)
  scale = default_scale(scale, dk)
  if top_k == 1:
    return context_parallel_softmax_attn(
        q, k, v, scale=scale, segment_ids=segment_ids, block_size=chunk_size,
        axis_name=axis_name, mesh=mesh)
  local = cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  halo = min(block_size - 1, t - local)

  def device(split, whole):
    del whole
    q, k, v, ids = split
    k_all, v_all = jax.lax.all_gather((k, v), axis_name, axis=1, tiled=True)
    if ids is not None:
      ids = jax.lax.all_gather(ids, axis_name, axis=1, tiled=True)
    o = chunk.blockwise_moba(
        q, k_all, v_all, blocks.documents(ids, b, t),
        q_offset=cp.device_index(axis_name) * local, halo=halo,
        block_size=block_size, top_k=top_k, scale=scale, chunk=chunk_size)
    return o.astype(v.dtype), None

  return cp.map_sequence(device, (q, k, v, segment_ids), None,
                         axis_name=axis_name, mesh=mesh)[0]
