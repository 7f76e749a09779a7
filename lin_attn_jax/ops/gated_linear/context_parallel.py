"""The gated-linear-attention core split over a ``sequence`` mesh axis.

Each device runs the chunk form (or its Pallas kernel) on its tokens from a
zero state: its outputs ``o``, and its final state ``R_p [B, H, K, V]``.
Its decay ``M_p = exp(sum of its log-gates) [B, H, G]`` (0 where a document
starts inside the device) completes its summary
(``common/context_parallel.py``).
One all-gather of the ``P`` pairs and a prefix combine ``S_{p+1} = M_p * S_p
+ R_p`` give the state ``S_p`` entering the device, whose contribution the
outputs then get: ``o_i += (scale q_i * exp(G_i)) . S_p``, ``G_i`` the sum of
the device's gates up to ``i`` (before ``i`` when strictly causal), for the
tokens before the device's first document start. The heavy pass does not
wait for the all-gather. Every variant on the core (linear attention,
simple GLA, retention, GLA, Based, SSD, RWKV-6 with its strictly causal
read and bonus, HGRN2) reaches it through ``chunk_gated_linear``.

Non-causal with gates, the split runs forward and on the reversed sequence
(LION, ``bidirectional.py``). Non-causal without gates (plain linear
attention, its normaliser being one more value column) every token reads
its whole document's sum ``sum_j k_j v_j^T``, so one all-reduce replaces
the two scans (``_noncausal_sums``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.gated_linear import chunk
from lin_attn_jax.ops.gated_linear.bidirectional import (gate_as_given,
                                                   lion_outputs)
from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate

_F32 = jnp.float32


def _decay_rows(decay, state):
  """``decay [B, H, G]`` scales the rows of ``state [B, H, K, V]``."""
  return decay[..., None] * state


def _log_gates(g, shape):
  """float32 ``[B, L, H, G]`` log-decays (zeros for ``g=None``)."""
  if g is None:
    return jnp.zeros(shape[:3] + (1,), _F32)
  g = jnp.asarray(g, _F32)
  return g[..., None] if g.ndim == 3 else g


def _entering_read(q, g, segment_ids, entering, *, scale, strict):
  """``(scale q_i exp(G_i)) . S_p`` for the tokens the entering state
  reaches, ``[B, L, H, V]`` float32.

  ``G_i`` sums the gates from the device's first token to ``i`` (to ``i - 1``
  when strict): a sum of gates ``<= 0``, so ``exp`` of it is a decay.
  """
  b, length = q.shape[:2]
  g = _log_gates(g, q.shape)
  to_here = jnp.cumsum(g, axis=1)                               # [B, L, H, G]
  if strict:
    to_here = jnp.concatenate([jnp.zeros_like(to_here[:, :1]),
                               to_here[:, :-1]], axis=1)
  reached = (document_index(segment_ids, b, length) == 0)[..., None, None]
  read = jnp.where(reached, scale * jnp.asarray(q, _F32) * jnp.exp(to_here),
                   0.0)                                         # [B, L, H, K]
  return jnp.einsum("blhk,bhkv->blhv", read, entering,
                    preferred_element_type=_F32)


def context_parallel_gated_linear(q, k, v, g=None, *, scale=None,
                                  initial_state=None, output_final_state=False,
                                  segment_ids=None, chunk_size=64,
                                  sub_chunk_size=8, impl="auto",
                                  strictly_causal=False, causal=True,
                                  axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_gated_linear`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_gated_linear``, plus:
    axis_name: the mesh axis the sequence is split over (``P`` devices, T a
      multiple of ``P``).
    mesh: the mesh, or None for the current one (``jax.set_mesh``).

  ``chunk_gated_linear`` (and every variant on it) calls this itself when
  the current mesh has a ``"sequence"`` axis of size > 1. Outputs in a
  low-precision dtype are rounded twice (the device's part, then the sum).
  With ``causal=False`` the split runs forward and on the reversed sequence
  (``bidirectional.py``).
  """
  _, t, _, dk, _, g_checked = validate(q, k, v, g, initial_state,
                                       segment_ids)
  cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  scale = default_scale(scale, dk)
  check_no_state("chunk_gated_linear", causal, initial_state,
                 output_final_state)
  if not causal:
    if strictly_causal:
      raise ValueError("strictly_causal=True has no non-causal form")
    if g_checked is None:
      return _noncausal_sums(q, k, v, scale=scale, segment_ids=segment_ids,
                             chunk_size=chunk_size,
                             sub_chunk_size=sub_chunk_size, impl=impl,
                             axis_name=axis_name, mesh=mesh), None
    form = functools.partial(
        context_parallel_gated_linear, chunk_size=chunk_size,
        sub_chunk_size=sub_chunk_size, impl=impl, axis_name=axis_name,
        mesh=mesh)
    return lion_outputs(form, q, k, v, gate_as_given(g_checked), scale=scale,
                        segment_ids=segment_ids).astype(v.dtype), None

  def device(split, whole):
    q, k, v, g, ids = split
    (initial,) = whole
    o, own = chunk.chunk_gated_linear(
        q, k, v, g, scale=scale, output_final_state=True, segment_ids=ids,
        chunk_size=chunk_size, sub_chunk_size=sub_chunk_size, impl=impl,
        strictly_causal=strictly_causal)
    b, length = q.shape[:2]
    inside = document_index(ids, b, length)[:, -1] > 0          # [B]
    decay = jnp.exp(jnp.sum(_log_gates(g, q.shape), axis=1))    # [B, H, G]
    decay = jnp.where(inside[:, None, None], 0.0, decay)
    entering, final = cp.carry_states(
        own, decay, _decay_rows, initial, cp.document_starts(ids, axis_name),
        axis_name=axis_name)
    # Recomputed in the backward pass rather than stored.
    read = jax.checkpoint(
        lambda q, g, s: _entering_read(q, g, ids, s, scale=scale,
                                       strict=strictly_causal))
    o = (o.astype(_F32) + read(q, g, entering)).astype(v.dtype)
    return o, (final if output_final_state else None)

  return cp.map_sequence(device, (q, k, v, g, segment_ids), (initial_state,),
                         axis_name=axis_name, mesh=mesh)


def _boundary_slots(ids, b: int, length: int, axis_name: str):
  """``[B, L, P]`` float32 one-hot: the slot of each token of this device
  whose document reaches past the device, none for the others.

  Slot ``s`` is the document holding device ``s``'s last token, keyed by the
  device its first token is on: only such a document can cross a device
  boundary, so ``P`` slots hold every crossing document, however many
  documents there are. One all-gather of three numbers per row and device.
  """
  parts = jax.lax.axis_size(axis_name)
  here = cp.device_index(axis_name)
  doc = document_index(ids, b, length)                          # [B, L]
  last = doc[:, -1]                                              # [B]
  if ids is None:
    ends = jnp.zeros((parts, b, 3), jnp.int32)
  else:
    ends = jax.lax.all_gather(
        jnp.stack([ids[:, 0], ids[:, -1], last], axis=-1).astype(jnp.int32),
        axis_name)                                               # [P, B, 3]
  starts = jnp.concatenate(
      [jnp.ones_like(ends[:1, :, 0], bool),
       ends[1:, :, 0] != ends[:-1, :, 1]], axis=0)               # [P, B]
  begins = starts | (ends[..., 2] > 0)                           # [P, B]
  devices = jnp.arange(parts)[:, None]
  origin_last = jax.lax.cummax(jnp.where(begins, devices, 0), axis=0)
  previous = jnp.concatenate([jnp.zeros_like(origin_last[:1]),
                              origin_last[:-1]], axis=0)
  origin_first = jnp.where(starts, devices, previous)            # [P, B]
  continued = ~starts[here]                                      # [B]
  slot = jnp.where(doc == last[:, None], origin_last[here][:, None],
                   jnp.where((doc == 0) & continued[:, None],
                             origin_first[here][:, None], -1))   # [B, L]
  return jax.nn.one_hot(slot, parts, dtype=_F32)                 # [B, L, P]


def _noncausal_sums(q, k, v, *, scale, segment_ids, chunk_size,
                    sub_chunk_size, impl, axis_name, mesh):
  """Non-causal ungated ``o_i = scale q_i . sum_{j in i's document} k_j
  v_j^T`` split over ``axis_name``, ``[B, T, H, V]`` in ``v``'s dtype.

  Each device runs the non-causal chunk form on its tokens (its documents'
  local sums), and adds to the tokens of its first and last documents the
  part of their sums held by the other devices: the sums ``[B, P, H, K, V]``
  of the documents that cross a device boundary (``_boundary_slots``), one
  ``psum`` over the axis, less this device's own part. Exact with documents
  spanning any number of devices; the table grows with ``P``, not with the
  number of documents.
  """

  def device(split, whole):
    del whole
    q, k, v, ids = split
    b, length = q.shape[:2]
    o, _ = chunk.chunk_gated_linear(
        q, k, v, None, scale=scale, segment_ids=ids, chunk_size=chunk_size,
        sub_chunk_size=sub_chunk_size, impl=impl, causal=False)
    slots = _boundary_slots(ids, b, length, axis_name)           # [B, L, P]
    own = jnp.einsum("blp,blhk,blhv->bphkv", slots, jnp.asarray(k, _F32),
                     jnp.asarray(v, _F32),
                     preferred_element_type=_F32)                # [B,P,H,K,V]
    others = jax.lax.psum(own, axis_name) - own
    read = jnp.einsum("blp,blhk,bphkv->blhv", slots,
                      scale * jnp.asarray(q, _F32), others,
                      preferred_element_type=_F32)               # [B, L, H, V]
    return (o.astype(_F32) + read).astype(v.dtype), None

  o, _ = cp.map_sequence(device, (q, k, v, segment_ids), (),
                         axis_name=axis_name, mesh=mesh)
  return o
