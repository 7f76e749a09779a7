"""Forgetting attention split over a ``sequence`` mesh axis, exactly.

The softmax family's split (``softmax_attn/context_parallel.py``) plus the
gate. Device ``p`` holds tokens ``[p L, (p + 1) L)``; its decay biases need
``c_t``, the gate summed from the start of the token's document, which for
the device's first document begins on an earlier device. Two paths:

- **Sliding window** (``w - 1 <= L``): the halo of the previous device's
  last ``w - 1`` tokens, keys, values and gates (one ``ppermute`` of
  ``[B, w - 1, Hkv (K + V) + H]``), and the blockwise form on the halo and
  the device's tokens. The gate sums restart at the halo's first token: a
  query's window lies inside the halo and its own tokens, and ``c_i - c_j``
  does not depend on where the sum starts.
- **Everything else**: every device sums its own gates from zero
  (``c_local``, restarting at document starts inside it) and exchanges
  ``(c_local of its last token [B, H], whether a document starts inside
  it [B])``: one all-gather of ``P`` such summaries. A prefix combine over
  the devices gives the offset entering device ``p``, ``c_in_p = c_last_{p
  - 1} + (c_in_{p - 1} unless a document starts inside device p - 1)``, zero
  where a document starts at device ``p``'s first token. The device adds it
  to the tokens of its first document (``c = c_local + c_in``), then
  gathers the keys, values and the keys' ``c`` of the whole sequence (one
  all-gather of ``[B, T, Hkv (K + V) + H]``, as the softmax split gathers
  keys and values; its transpose returns their gradients) and attends its
  own queries to them with the block-sparse online softmax, the causal
  mask offset by the device's first position.

Both paths give the single-device results up to float32 rounding.

``impl`` reaches the halo path: the blockwise pass on the halo and the
device's tokens is ``chunk_forgetting_attn``'s, kernels included (per shard
of batch and heads), since it attends one stretch of tokens to itself, as
the kernels do. The gathered path stays XLA whatever ``impl`` says: its
queries are the device's ``L`` tokens and its keys the whole sequence, at
an offset the kernels do not take, and running them on the gathered
sequence would compute the outputs of all ``T`` queries on every device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common import dispatch
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.segments import document_index, reset_flags
from lin_attn_jax.ops.forgetting_attn import chunk
from lin_attn_jax.ops.forgetting_attn.gate_sums import gate_cumsum
from lin_attn_jax.ops.forgetting_attn.inputs import validate
from lin_attn_jax.ops.softmax_attn.blocksparse import blocksparse_attention
from lin_attn_jax.ops.softmax_attn.chunk import padded_positions
from lin_attn_jax.ops.softmax_attn.context_parallel import (gather_keys,
                                                            gathered_pairs,
                                                            with_halo)
from lin_attn_jax.ops.softmax_attn.inputs import (check_block_size,
                                                  default_scale)


def entering_gate_sum(c_local, segment_ids, axis_name):
  """``[B, H]``: the gate sum from the start of the document of this
  device's first token up to the token before it (0 where the document
  starts here).

  ``c_local [B, L, H]``: this device's gate sums from zero, restarting at
  document starts inside it. One all-gather of ``(c_local[:, -1], a
  document starts inside the device)`` per device.
  """
  b, length = c_local.shape[:2]
  inside = jnp.any(reset_flags(segment_ids, b, length), axis=1)  # [B]
  lasts, insides = jax.lax.all_gather((c_local[:, -1], inside), axis_name)
  starts = cp.document_starts(segment_ids, axis_name)           # [P, B]
  if starts is None:
    starts = jnp.zeros(insides.shape, bool)

  def combine(entering, xs):
    last, restarted, start = xs
    entering = jnp.where(start[:, None], 0.0, entering)
    return last + jnp.where(restarted[:, None], 0.0, entering), entering

  _, entering = jax.lax.scan(combine, jnp.zeros_like(lasts[0]),
                             (lasts, insides, starts))
  return entering[cp.device_index(axis_name)]


def _gathered(q, k, v, g, segment_ids, *, scale, window_size, block_size,
              axis_name):
  """The gathered path, on one device's ``[B, L, ...]`` blocks."""
  b, length = q.shape[:2]
  parts = jax.lax.axis_size(axis_name)
  total = parts * length
  c_local = gate_cumsum(g, segment_ids)                         # [B, L, H]
  first_document = document_index(segment_ids, b, length) == 0  # [B, L]
  gates = c_local + jnp.where(
      first_document[..., None],
      entering_gate_sum(c_local, segment_ids, axis_name)[:, None], 0.0)
  c = min(block_size, length)
  offset, (k_all, v_all, gates_all), doc_q, doc_k = gather_keys(
      (k, v, gates), segment_ids, block=c, axis_name=axis_name)
  q_blocks, k_blocks = gathered_pairs(block=c, length=length, parts=parts,
                                      window_size=window_size)
  o, _ = blocksparse_attention(
      pad_time(jnp.asarray(q, jnp.float32), c),
      pad_time(jnp.asarray(k_all, jnp.float32), c),
      pad_time(jnp.asarray(v_all, jnp.float32), c), doc_q, doc_k,
      q_pos=padded_positions(np.arange(length), c),
      k_pos=padded_positions(np.arange(total), c),
      pairs=(q_blocks, k_blocks, [0] * len(q_blocks)),
      rule=chunk.causal_rule(window_size), block_size=c, scale=scale,
      q_offset=offset, q_bias=pad_time(gates, c),
      k_bias=pad_time(gates_all, c))
  return o[:, :length].astype(v.dtype)


def context_parallel_forgetting_attn(q, k, v, g, *, scale=None,
                                     window_size=None, segment_ids=None,
                                     block_size=128, impl="auto",
                                     axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_forgetting_attn`` with T split over the devices of
  ``axis_name``.

  Arguments and result as in ``chunk_forgetting_attn``, plus ``axis_name``
  (T a multiple of its size) and ``mesh`` (None for the current one). A
  window with ``w - 1 <= T / P`` takes a halo from the previous device and
  runs the blockwise form of ``impl`` on it and the device's tokens;
  everything else gathers the keys, values and gate sums and runs the XLA
  block-sparse pass, whatever ``impl`` (see the module docstring).
  ``chunk_forgetting_attn`` calls this itself when the current mesh has a
  ``"sequence"`` axis of size > 1.
  """
  _, t, _, _, dk, _ = validate(q, k, v, g, segment_ids, window_size)
  check_block_size(block_size)
  dispatch.check_impl(impl)
  local = cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  scale = default_scale(scale, dk)
  halo = window_size is not None and window_size - 1 <= local

  def device(split, whole):
    del whole
    q, k, v, g, ids = split
    if halo:
      return with_halo(
          lambda q, keys, ids: chunk.chunk_forgetting_attn(
              q, *keys, window_size=window_size, segment_ids=ids,
              scale=scale, block_size=block_size, impl=impl),
          q, (k, v, g), ids, width=window_size - 1,
          axis_name=axis_name), None
    return _gathered(q, k, v, g, ids, scale=scale, window_size=window_size,
                     block_size=block_size, axis_name=axis_name), None

  return cp.map_sequence(device, (q, k, v, g, segment_ids), None,
                         axis_name=axis_name, mesh=mesh)[0]
