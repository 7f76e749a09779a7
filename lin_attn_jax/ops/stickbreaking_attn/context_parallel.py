"""Stick-breaking attention split over a ``sequence`` mesh axis.

A query's weights depend on every visible key before it: the stick it
offers a key is what all nearer keys left. So, as for full softmax
attention (``softmax_attn/context_parallel.py``), every device gathers the
keys and values of the whole sequence (one all-gather of ``[B, T / P, Hkv,
K]`` and ``[B, T / P, Hkv, V]`` per device, and of the ``[B, T / P]``
segment ids when given; in the backward pass its transpose, a
reduce-scatter, returns the keys' and values' gradients) and walks its own
query blocks over them with the blockwise form, the visibility offset by
the device's first position. Key blocks past a device's last query are
wholly invisible to it and leave its sticks as they are; SPMD runs every
device over the key blocks of the last one, as the softmax path does.

The walk could also pass the devices' blocks around a ring, nearest device
first: outputs merge as ``o = o_near + exp(log_rem_near) o_far`` and
``log_rem = log_rem_near + log_rem_far``. The bytes each device receives
are the same, ``(P - 1) T / P`` tokens of ``Hkv (K + V)`` numbers, in one
collective instead of ``P - 1`` dependent steps, so the gather is what runs
here; the ring would pay off only where one device cannot hold the keys
and values of the whole sequence.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.softmax_attn.chunk import padded_positions
from lin_attn_jax.ops.softmax_attn.context_parallel import gather_keys
from lin_attn_jax.ops.softmax_attn.inputs import (check_block_size,
                                                  default_scale)
from lin_attn_jax.ops.stickbreaking_attn import chunk
from lin_attn_jax.ops.stickbreaking_attn.blockwise import (
    stickbreaking_blocks, walk_pairs)
from lin_attn_jax.ops.stickbreaking_attn.inputs import validate


def _gathered(q, k, v, segment_ids, *, scale, attend_current, block_size,
              axis_name, output_rem):
  """One device's ``[B, L, ...]`` blocks against the gathered keys."""
  length = q.shape[1]
  parts = jax.lax.axis_size(axis_name)
  total = parts * length
  c = min(block_size, length)
  offset, (k_all, v_all), doc_q, doc_k = gather_keys(
      (k, v), segment_ids, block=c, axis_name=axis_name)
  num_k = -(-total // c)

  def key_blocks(n):
    """Every key block up to the last device's query block ``n``, nearest
    first."""
    last = min((parts - 1) * length + (n + 1) * c, total) - 1
    return range(min(num_k - 1, last // c), -1, -1)

  o, log_rem = stickbreaking_blocks(
      pad_time(jnp.asarray(q, jnp.float32), c),
      pad_time(jnp.asarray(k_all, jnp.float32), c),
      pad_time(jnp.asarray(v_all, jnp.float32), c), doc_q, doc_k,
      q_pos=padded_positions(np.arange(length), c),
      k_pos=padded_positions(np.arange(total), c),
      pairs=walk_pairs(range(-(-length // c)), key_blocks),
      attend_current=attend_current, block_size=c, scale=scale,
      q_offset=offset)
  return chunk.finish(o, log_rem, length, v.dtype, output_rem)


def context_parallel_stickbreaking_attn(q, k, v, *, scale=None,
                                        attend_current=False,
                                        segment_ids=None, block_size=64,
                                        output_rem=False,
                                        axis_name=cp.SEQUENCE_AXIS,
                                        mesh=None):
  """``chunk_stickbreaking_attn`` with T split over the devices of
  ``axis_name``.

  Arguments and result as in ``chunk_stickbreaking_attn``, plus
  ``axis_name`` (T a multiple of its size) and ``mesh`` (None for the
  current one). ``chunk_stickbreaking_attn`` calls this itself when the
  current mesh has a ``"sequence"`` axis of size > 1.
  """
  _, t, _, _, dk, _ = validate(q, k, v, segment_ids, attend_current)
  check_block_size(block_size)
  cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  scale = default_scale(scale, dk)

  def device(split, whole):
    del whole
    out = _gathered(*split, scale=scale, attend_current=attend_current,
                    block_size=block_size, axis_name=axis_name,
                    output_rem=output_rem)
    return out, None

  return cp.map_sequence(device, (q, k, v, segment_ids), None,
                         axis_name=axis_name, mesh=mesh)[0]
