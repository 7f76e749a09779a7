"""Softmax attention split over a ``sequence`` mesh axis.

Two paths, both exact:

- **Sliding window** (causal, ``w - 1 <= T / P``, no global positions): a
  query sees only the ``w - 1`` keys before it, so each device takes the last
  ``w - 1`` keys and values of the previous device (one ``ppermute`` of
  ``[B, w - 1, Hkv, K + V]``) and runs the blockwise form on its own tokens
  with that halo in front. Communication and work per device do not grow
  with ``T``.
- **Full attention** (and any other pattern): every device gathers the keys
  and values of the whole sequence (one all-gather; its transpose, a
  reduce-scatter, returns their gradients) and attends its own queries to
  them with the block-sparse online softmax, the causal mask offset by the
  device's first position. We gather rather than pass blocks around a ring:
  the bytes each device receives are the same, ``(P - 1) T / P`` tokens of
  ``Hkv (K + V)`` numbers, in one collective instead of ``P - 1`` dependent
  steps, and the single-device block-sparse kernel and its recomputing
  backward serve unchanged. With contiguous blocks both schemes leave the
  causal work unbalanced (device ``p`` needs ``(p + 1) / P`` of the keys, and
  SPMD runs every device over the largest set), and the gathered keys and
  values cost ``O(T)`` memory per device; a ring would only pay off where the
  keys and values of the whole sequence do not fit one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.softmax_attn import chunk, masks
from lin_attn_jax.ops.softmax_attn.blocksparse import blocksparse_attention
from lin_attn_jax.ops.softmax_attn.inputs import (check_block_size,
                                                  default_scale, validate)


def with_halo(attend, q, keys, segment_ids, *, width, axis_name):
  """The sliding-window path, on one device's ``[B, L, ...]`` blocks.

  ``attend(queries, keys, segment_ids)`` (a causal blockwise form) runs on
  the previous device's last ``width`` tokens of each of ``keys`` (a tuple
  of ``[B, L, ...]``) in front of this device's; zero queries stand for
  the halo, and device 0's halo gets a segment id of its own. Returns the
  outputs of this device's queries.
  """
  if width == 0:
    return attend(q, keys, segment_ids)
  b, length = q.shape[:2]
  ids = (jnp.zeros((b, length), jnp.int32) if segment_ids is None
         else segment_ids)
  # Device 0 has no keys before its first token: give its halo another id.
  halo_ids = jnp.where(cp.first_device(axis_name), ids[:, :1] - 1,
                       cp.previous_tokens(ids, width, axis_name))
  queries = jnp.concatenate([jnp.zeros_like(q[:, :width]), q], axis=1)
  o = attend(queries,
             tuple(jnp.concatenate(
                 [cp.previous_tokens(x, width, axis_name), x], axis=1)
                   for x in keys),
             jnp.concatenate([halo_ids, ids], axis=1))
  return o[:, width:]


def _key_blocks(n, *, block, length, parts, causal, window_size, has_globals):
  """Key blocks that query block ``n`` of some device may attend to."""
  first_q = n * block
  last_q = min(length, (n + 1) * block) - 1
  total = parts * length
  num_k = -(-total // block)
  needed = set()
  for p in range(parts):
    lo, hi = p * length + first_q, p * length + last_q
    if causal:
      end = hi
      start = 0 if window_size is None or has_globals else lo - window_size + 1
    else:
      start, end = 0, total - 1
      if window_size is not None and not has_globals:
        start, end = lo - window_size + 1, hi + window_size - 1
    needed.update(range(max(0, start) // block,
                        min(num_k - 1, max(0, end) // block) + 1))
  return sorted(needed)


def gathered_pairs(*, block, length, parts, causal=True, window_size=None,
                   has_globals=False):
  """``(query blocks, key blocks)``: the pairs of blocks of ``block``
  tokens that a device's ``length`` queries meet in the gathered sequence
  of ``parts * length`` keys (the union over the devices, since SPMD runs
  one program)."""
  q_blocks, k_blocks = [], []
  for n in range(-(-length // block)):
    keys = _key_blocks(n, block=block, length=length, parts=parts,
                       causal=causal, window_size=window_size,
                       has_globals=has_globals)
    q_blocks += [n] * len(keys)
    k_blocks += keys
  return q_blocks, k_blocks


def gather_keys(keys, segment_ids, *, block, axis_name):
  """The gathered path's inputs, on one device's ``[B, L, ...]`` blocks.

  Args:
    keys: a tuple of ``[B, L, ...]`` arrays to gather over the whole
      sequence (one all-gather; its transpose, a reduce-scatter, returns
      their gradients).
    segment_ids: ``[B, L]`` or None; block: the block size of the pass.
  Returns:
    ``(offset, keys [B, T, ...] each, doc_q [B, L_pad] or None, doc_k [B,
    T_pad] or None)``: the device's first position, the gathered keys, and
    the document indices of its queries and of every key, padded with the
    edge to whole blocks.
  """
  b, length = keys[0].shape[:2]
  total = jax.lax.axis_size(axis_name) * length
  offset = cp.device_index(axis_name) * length
  keys = jax.lax.all_gather(tuple(keys), axis_name, axis=1, tiled=True)
  doc_q = doc_k = None
  if segment_ids is not None:
    doc_all = document_index(
        jax.lax.all_gather(segment_ids, axis_name, axis=1, tiled=True),
        b, total)                                               # [B, T]
    doc_q = pad_time(jax.lax.dynamic_slice_in_dim(doc_all, offset, length,
                                                  axis=1), block, mode="edge")
    doc_k = pad_time(doc_all, block, mode="edge")
  return offset, keys, doc_q, doc_k


def _gathered(q, k, v, segment_ids, *, scale, causal, window_size, glob,
              block_size, axis_name):
  """The gathered path, on one device's ``[B, L, ...]`` blocks."""
  length = q.shape[1]
  parts = jax.lax.axis_size(axis_name)
  total = parts * length
  c = min(block_size, length)
  offset, (k_all, v_all), doc_q, doc_k = gather_keys(
      (k, v), segment_ids, block=c, axis_name=axis_name)
  flags = masks.global_flags_table(glob, total)

  def rule(i, j, rule_id):
    del rule_id
    return masks.dense_mask(i, j, causal=causal, window_size=window_size,
                            global_flags=flags)

  q_blocks, k_blocks = gathered_pairs(
      block=c, length=length, parts=parts, causal=causal,
      window_size=window_size, has_globals=bool(glob.size))
  o, _ = blocksparse_attention(
      pad_time(jnp.asarray(q, jnp.float32), c),
      pad_time(jnp.asarray(k_all, jnp.float32), c),
      pad_time(jnp.asarray(v_all, jnp.float32), c), doc_q, doc_k,
      q_pos=chunk.padded_positions(np.arange(length), c),
      k_pos=chunk.padded_positions(np.arange(total), c),
      pairs=(q_blocks, k_blocks, [masks.BASE] * len(q_blocks)), rule=rule,
      block_size=c, scale=scale, q_offset=offset)
  return o[:, :length].astype(v.dtype)


def context_parallel_softmax_attn(q, k, v, *, scale=None, causal=True,
                                  window_size=None, segment_ids=None,
                                  global_positions=None, block_size=128,
                                  axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_softmax_attn`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_softmax_attn``, plus ``axis_name`` (T
  a multiple of its size) and ``mesh`` (None for the current one). A causal
  window with ``w - 1 <= T / P`` and no global positions takes a halo from
  the previous device; everything else gathers the keys and values.
  ``chunk_softmax_attn`` calls this itself when the current mesh has a
  ``"sequence"`` axis of size > 1.
  """
  _, t, _, _, dk, _, glob = validate(q, k, v, segment_ids, window_size,
                                     global_positions)
  check_block_size(block_size)
  local = cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  scale = default_scale(scale, dk)
  if window_size is None:
    glob = glob[:0]                     # the full pattern already has them
  halo = (causal and window_size is not None and not glob.size
          and window_size - 1 <= local)

  def device(split, whole):
    del whole
    q, k, v, ids = split
    if halo:
      return with_halo(
          lambda q, keys, ids: chunk.chunk_softmax_attn(
              q, *keys, window_size=window_size, segment_ids=ids,
              scale=scale, block_size=block_size),
          q, (k, v), ids, width=window_size - 1, axis_name=axis_name), None
    return _gathered(q, k, v, ids, scale=scale, causal=causal,
                     window_size=window_size, glob=glob,
                     block_size=block_size, axis_name=axis_name), None

  return cp.map_sequence(device, (q, k, v, segment_ids), None,
                         axis_name=axis_name, mesh=mesh)[0]
