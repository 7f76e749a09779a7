"""PaTH attention split over a ``sequence`` mesh axis, exactly.

Device ``p`` holds tokens ``[p L, (p + 1) L)``. A logit between a query
``i`` on device ``p`` and a key ``j`` on an earlier device ``p'`` factors
at the devices' boundaries:

    z_ij = (q_i^T H_i ... H_{pL}) D_{p-1} ... D_{p'+1} (H_{e} ... H_{j+1} k_j)

with ``D_d`` the product of device ``d``'s reflections and ``e`` the last
token of device ``p'``. So:

1. each device runs the blockwise form on its own tokens, which also
   gives its queries moved back to its first token and their gate sums
   from there (``chunk.attend_chunks``), and summarises itself
   (``chunk.sequence_summary``): its keys moved to its last token, their
   gate sums to there, ``D_p`` as a dense ``[K, K]`` matrix per key head
   and its gate total;
2. one all-gather of those summaries and of the values: per device ``L x
   Hkv x (K + V)`` numbers of keys and values, ``L x H`` of gate sums,
   ``Hkv x K x K`` of the product and ``H`` of the gate total (the product
   is a dense matrix rather than the device's ``L x K`` WY factors, which
   are larger whenever ``2 L > K``); its transpose, a reduce-scatter,
   returns the gradients;
3. each device moves the earlier devices' keys to its first token (``P``
   products with the dense ``D_d``, ``O(T K^2)`` per key head) and attends
   its queries to them with the block-sparse online softmax of the
   softmax family (``softmax_attn.blocksparse``, recomputing backward),
   the gate's bias ``a_i + b_j`` folded into two extra channels of the
   queries and keys (per query head: keys and values are repeated to the
   query heads when there is a gate);
4. the two passes (own tokens, earlier devices) merge exactly through
   their log-sum-exps.

Like the gathered path of softmax attention, every device holds the keys
and values of the whole sequence (``O(T)`` memory) and the causal work is
unbalanced across devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.path_attn import chunk
from lin_attn_jax.ops.path_attn.inputs import default_scale, validate
from lin_attn_jax.ops.softmax_attn.blocksparse import blocksparse_attention
from lin_attn_jax.ops.softmax_attn.chunk import padded_positions

_F32 = jnp.float32


def _every_pair(i, j, rule_id):
  """The block-sparse rule of the earlier devices' pass: every pair (the
  documents mask the rest)."""
  del rule_id
  return np.ones(np.broadcast_shapes(np.shape(i), np.shape(j)), bool)


def _earlier_devices(q_first, gate_first, keys, gate_end, product, total,
                     v_all, doc_q, doc_k, *, scale, block, axis_name):
  """Each local query against the earlier devices' keys: ``(o [B, L, H,
  V], lse [B, L, H])`` (``-inf`` where none is visible)."""
  b, length, h, dk = q_first.shape
  hkv = keys.shape[2]
  parts = jax.lax.axis_size(axis_name)
  me = cp.device_index(axis_name)
  earlier = (parts - 1) * length
  moved, bias = [], []
  later = jnp.broadcast_to(jnp.eye(dk, dtype=_F32), (b, hkv, dk, dk))
  offset = None if total is None else jnp.zeros((b, h), _F32)
  for d in reversed(range(parts - 1)):
    before = d < me
    own = slice(d * length, (d + 1) * length)
    moved.append(jnp.einsum("bjhl,bhkl->bjhk", keys[:, own], later,
                            preferred_element_type=_F32))       # [B,L,h,K]
    later = jnp.where(before, jnp.einsum("bhkl,bhlm->bhkm", later,
                                         product[d],
                                         preferred_element_type=_F32), later)
    if total is not None:
      bias.append(gate_end[:, own] + offset[:, None])           # [B, L, H]
      offset = jnp.where(before, offset + total[d], offset)
  k_x = jnp.concatenate(moved[::-1], axis=1)                    # [B,(P-1)L,h,K]
  v_x = v_all[:, :earlier]
  q_x = q_first
  if total is not None:
    group = h // hkv
    b_x = jnp.concatenate(bias[::-1], axis=1)                   # [B,(P-1)L,H]
    ones_k = jnp.ones((b, earlier, h, 1), _F32)
    k_x = jnp.concatenate([jnp.repeat(k_x, group, axis=2), ones_k,
                           b_x[..., None]], axis=-1)            # [B,.,H,K+2]
    v_x = jnp.repeat(v_x, group, axis=2)
    q_x = jnp.concatenate([q_first, gate_first[..., None],
                           jnp.ones((b, length, h, 1), _F32)], axis=-1)
  c = min(block, length)
  positions = np.arange(earlier)
  doc_k = jnp.where(jnp.asarray(positions)[None] < me * length,
                    doc_k[:, :earlier], -1)                     # [B,(P-1)L]
  nq, nk = -(-length // c), -(-earlier // c)
  pairs = (np.repeat(np.arange(nq), nk), np.tile(np.arange(nk), nq),
           np.zeros(nq * nk, np.int32))
  o, lse = blocksparse_attention(
      pad_time(q_x, c), pad_time(k_x, c), pad_time(v_x, c),
      pad_time(doc_q, c, mode="edge"), pad_time(doc_k, c, mode="edge"),
      q_pos=padded_positions(np.arange(length), c),
      k_pos=padded_positions(positions, c), pairs=pairs, rule=_every_pair,
      block_size=c, scale=scale)
  return o[:, :length], lse[:, :length]


def _merge(o_a, lse_a, o_b, lse_b):
  """Softmax over the union of two disjoint key sets from their passes;
  ``lse_a`` is finite (every query sees its own key)."""
  top = jax.lax.stop_gradient(jnp.maximum(lse_a, lse_b))
  w_a, w_b = jnp.exp(lse_a - top), jnp.exp(lse_b - top)         # [B, L, H]
  return ((w_a[..., None] * o_a + w_b[..., None] * o_b)
          / (w_a + w_b)[..., None])


def context_parallel_path_attn(q, k, v, w, beta, g=None, *, scale=None,
                               segment_ids=None, chunk_size=64,
                               axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_path_attn`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_path_attn``, plus ``axis_name`` (T a
  multiple of its size) and ``mesh`` (None for the current one).
  ``chunk_path_attn`` calls this itself when the current mesh has a
  ``"sequence"`` axis of size > 1. The exchange is in the module
  docstring.
  """
  b, t, _, _, dk, _ = validate(q, k, v, w, beta, g, segment_ids)
  checks.positive_int("chunk_size", chunk_size)
  cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  scale = default_scale(scale, dk)

  def device(split, whole):
    del whole
    q, k, v, w, beta, g, ids = split
    length = q.shape[1]
    ids = jnp.zeros((b, length), jnp.int32) if ids is None else ids
    doc_all = document_index(
        jax.lax.all_gather(ids, axis_name, axis=1, tiled=True), b,
        length * jax.lax.axis_size(axis_name))                  # [B, T]
    doc = jax.lax.dynamic_slice_in_dim(
        doc_all, cp.device_index(axis_name) * length, length, axis=1)
    terms, o, lse, q_first, gate_first = chunk.blockwise(
        q, k, v, w, beta, g, doc, scale=scale, chunk=chunk_size)
    keys, gate_end, product, total = chunk.sequence_summary(terms, length)
    gather = lambda x: jax.lax.all_gather(                      # noqa: E731
        x, axis_name, axis=1, tiled=True)
    o_x, lse_x = _earlier_devices(
        q_first, gate_first, gather(keys),
        None if g is None else gather(gate_end),
        jax.lax.all_gather(product, axis_name),
        None if g is None else jax.lax.all_gather(total, axis_name),
        gather(jnp.asarray(v, _F32)), doc, doc_all, scale=scale,
        block=chunk_size, axis_name=axis_name)
    return _merge(o, lse, o_x, lse_x).astype(v.dtype), None

  return cp.map_sequence(device, (q, k, v, w, beta, g, segment_ids), None,
                         axis_name=axis_name, mesh=mesh)[0]
