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
from lin_attn_jax.ops.softmax_attn.inputs import (check_block_size,
                                                  default_scale)


def _with_halo(q, k, v, g, segment_ids, *, window_size, options, axis_name):
  """The sliding-window path, on one device's ``[B, L, ...]`` blocks."""
  width = window_size - 1
  if width == 0:
    return chunk.chunk_forgetting_attn(q, k, v, g, window_size=window_size,
                                       segment_ids=segment_ids, **options)
  b, length = q.shape[:2]
  ids = (jnp.zeros((b, length), jnp.int32) if segment_ids is None
         else segment_ids)
  # Device 0 has no keys before its first token: give its halo another id.
  halo_ids = jnp.where(cp.first_device(axis_name), ids[:, :1] - 1,
                       cp.previous_tokens(ids, width, axis_name))
  halo_k, halo_v, halo_g = (cp.previous_tokens(x, width, axis_name)
                            for x in (k, v, g))
  queries = jnp.concatenate([jnp.zeros_like(q[:, :width]), q], axis=1)
  o = chunk.chunk_forgetting_attn(
      queries, jnp.concatenate([halo_k, k], axis=1),
      jnp.concatenate([halo_v, v], axis=1),
      jnp.concatenate([halo_g, g], axis=1), window_size=window_size,
      segment_ids=jnp.concatenate([halo_ids, ids], axis=1), **options)
  return o[:, width:]


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


def _key_blocks(n: int, *, block: int, length: int, parts: int,
                window_size) -> list[int]:
  """Key blocks of the whole sequence that query block ``n`` of some device
  may attend to (causal, within the window)."""
  num_k = -(-parts * length // block)
  needed = set()
  for p in range(parts):
    lo = p * length + n * block
    hi = p * length + min(length, (n + 1) * block) - 1
    start = 0 if window_size is None else max(0, lo - window_size + 1)
    needed.update(range(start // block, min(num_k - 1, hi // block) + 1))
  return sorted(needed)


def _gathered(q, k, v, g, segment_ids, *, scale, window_size, block_size,
              axis_name):
  """The gathered path, on one device's ``[B, L, ...]`` blocks."""
  b, length = q.shape[:2]
  parts = jax.lax.axis_size(axis_name)
  total = parts * length
  offset = cp.device_index(axis_name) * length
  c_local = gate_cumsum(g, segment_ids)                         # [B, L, H]
  first_document = document_index(segment_ids, b, length) == 0  # [B, L]
  gates = c_local + jnp.where(
      first_document[..., None],
      entering_gate_sum(c_local, segment_ids, axis_name)[:, None], 0.0)
  k_all, v_all, gates_all = jax.lax.all_gather((k, v, gates), axis_name,
                                               axis=1, tiled=True)
  c = min(block_size, length)
  doc_q = doc_k = None
  if segment_ids is not None:
    doc_all = document_index(
        jax.lax.all_gather(segment_ids, axis_name, axis=1, tiled=True),
        b, total)                                               # [B, T]
    doc_q = pad_time(jax.lax.dynamic_slice_in_dim(doc_all, offset, length,
                                                  axis=1), c, mode="edge")
    doc_k = pad_time(doc_all, c, mode="edge")
  q_blocks, k_blocks = [], []
  for n in range(-(-length // c)):
    keys = _key_blocks(n, block=c, length=length, parts=parts,
                       window_size=window_size)
    q_blocks += [n] * len(keys)
    k_blocks += keys
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
      return _with_halo(q, k, v, g, ids, window_size=window_size,
                        options=dict(scale=scale, block_size=block_size,
                                     impl=impl),
                        axis_name=axis_name), None
    return _gathered(q, k, v, g, ids, scale=scale, window_size=window_size,
                     block_size=block_size, axis_name=axis_name), None

  return cp.map_sequence(device, (q, k, v, g, segment_ids), None,
                         axis_name=axis_name, mesh=mesh)[0]
