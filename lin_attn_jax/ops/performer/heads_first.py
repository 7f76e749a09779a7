"""FAVOR+ linear attention chunkwise in XLA, features made heads first.

Performer's features are ``M`` wide (``int(K ln K)`` by default: 110 for
heads of ``K = 32`` channels, 266 for 64), several times the head width, so
every tensor of width ``M`` dominates the chunk form's time. Here they
are made once, in the layout of the chunk matmuls: q and k (``K`` wide) are
moved heads first (``[B, H, T, K]``), and the features come out of their
product with the projection already as ``[B, H, N, C, M]``: no ``M``-wide
tensor is transposed. There is no decay, so the pairs inside a chunk are
one masked ``[C, C]`` matmul per chunk and the states entering the chunks a
prefix sum over chunks (a ``lax.scan`` that stops a state where a document
starts when there are segment ids). The normalizer is kept apart from the
values, as row sums of the scores and a key-feature sum ``[M]`` in the
state: the value matmuls stay ``V`` wide (32) rather than ``V + 1``.

Query features are shifted by their largest exponent, here taken before
``-|x|^2 / 2`` is subtracted: the shift is a per-query constant (it and
``|x|^2 / 2`` cancel in the normalized output, values and gradients), so
the query's norm is never needed.

Letters: b batch, h head, n chunk, i and j positions in a chunk, m feature,
k channel of q and k, v value channel.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.products import mm_nn as _mm_nn
from lin_attn_jax.ops.common.products import mm_nt as _mm_nt
from lin_attn_jax.ops.common.products import transposed as _transposed
from lin_attn_jax.ops.common.segments import (chunk_documents,
                                             same_document_mask)

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def heads_first_features(x, projection, *, query: bool):
  """FAVOR+ features ``[B, T, H, K] -> [B, H, T, M]`` float32.

  ``phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(M)`` with ``x' = x / K ** 0.25``
  for keys; for queries ``exp(W x' - max_m (W x')_m) / sqrt(M)``, the same
  up to a per-query factor (which cancels in normalized attention).
  """
  m, dk = projection.shape
  xs = jnp.swapaxes(jnp.asarray(x, _F32), 1, 2) * dk ** -0.25  # [B, H, T, K]
  exponent = _mm("bhtk,mk->bhtm", xs, projection)              # [B, H, T, M]
  if query:
    exponent = exponent - jax.lax.stop_gradient(
        jnp.max(exponent, axis=-1, keepdims=True))
  else:
    exponent = exponent - 0.5 * jnp.sum(xs * xs, axis=-1, keepdims=True)
  return jnp.exp(exponent) * (1.0 / math.sqrt(m))


def favor_chunk(q, k, v, projection, *, initial_state, output_final_state,
                segment_ids, chunk_size, eps):
  """Normalized FAVOR+ attention, chunkwise.

  Args:
    q, k: ``[B, T, H, K]`` raw (before the feature map); v: ``[B, T, H, V]``.
    projection: ``[M, K]`` float32.
    initial_state: ``[B, H, M, V + 1]`` float32 (the last column the key
      feature sum) or None.
    output_final_state, segment_ids ``[B, T]`` or None, chunk_size: as in
      ``chunk_linear_attn``; eps: added to the normalizer.
  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state or None)``.
  """
  b, t, h, _ = q.shape
  dv = v.shape[-1]
  m = projection.shape[0]
  chunk = min(chunk_size, t)
  n = -(-t // chunk)
  projection = jnp.asarray(projection, _F32)

  def chunks(x):                                    # [B, H, T, *] -> chunks
    x = pad_time(x, chunk, axis=2)
    return x.reshape(x.shape[:2] + (n, chunk) + x.shape[3:])

  # Padded keys get zero features: they reach no output and no state.
  fq = chunks(heads_first_features(q, projection, query=True))  # [B,H,N,C,M]
  fk = chunks(heads_first_features(k, projection, query=False))
  v_c = chunks(jnp.swapaxes(jnp.asarray(v, _F32), 1, 2))       # [B,H,N,C,V]
  packed = segment_ids is not None

  scores = _mm_nt(fq, fk)                                      # [B,H,N,C,C]
  mask = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))
  if packed:
    doc_c, doc_before = chunk_documents(segment_ids, b, t, chunk)
    mask = mask & same_document_mask(doc_c, doc_c)[:, None]
    in_last_doc = (doc_c == doc_c[:, :, -1:]).astype(_F32)[:, None]
  scores = jnp.where(mask, scores, 0.0)
  num = _mm_nn(scores, v_c)                                    # [B,H,N,C,V]
  den = jnp.sum(scores, axis=-1)                               # [B,H,N,C]

  # States are kept transposed, [V, M]: each product below then contracts
  # the last axis of its left operand.
  v_t = _transposed(v_c)                                       # [B,H,N,V,C]
  if packed:
    own_v = _mm_nn(v_t * in_last_doc[..., None, :], fk)        # [B,H,N,V,M]
    own_z = _mm("bhnj,bhnjm->bhnm", in_last_doc, fk)           # [B,H,N,M]
  else:
    own_v = _mm_nn(v_t, fk)                                    # [B,H,N,V,M]
    own_z = jnp.sum(fk, axis=3)                                # [B,H,N,M]
  if initial_state is None:
    state_v = jnp.zeros((b, h, dv, m), _F32)
    state_z = jnp.zeros((b, h, m), _F32)
  else:
    init = jnp.asarray(initial_state, _F32)
    state_v, state_z = jnp.swapaxes(init[..., :dv], -1, -2), init[..., dv]
  passes = (None if not packed
            else (doc_c[:, :, -1] == doc_before).astype(_F32).T)  # [N, B]

  def carry(state, inputs):
    if packed:
      passes_n, own_n = inputs
      kept = jax.tree.map(
          lambda s: passes_n.reshape((b,) + (1,) * (s.ndim - 1)) * s, state)
    else:
      own_n, kept = inputs, state
    return jax.tree.map(jnp.add, kept, own_n), state

  owns = (jnp.moveaxis(own_v, 2, 0), jnp.moveaxis(own_z, 2, 0))
  (final_v, final_z), (enter_v, enter_z) = jax.lax.scan(
      carry, (state_v, state_z), (passes, owns) if packed else owns)
  read_v = _mm_nt(fq, jnp.moveaxis(enter_v, 0, 2))             # [B,H,N,C,V]
  read_z = _mm("bhnim,nbhm->bhni", fq, enter_z)                # [B,H,N,C]
  if packed:
    reached = (doc_c == doc_before[..., None])[:, None]        # [B,1,N,C]
    read_v = jnp.where(reached[..., None], read_v, 0.0)
    read_z = jnp.where(reached, read_z, 0.0)
  o = (num + read_v) / (den + read_z + eps)[..., None]         # [B,H,N,C,V]
  o = jnp.swapaxes(o.reshape(b, h, n * chunk, dv)[:, :, :t], 1, 2)
  o = o.astype(v.dtype)                                        # [B,T,H,V]
  if not output_final_state:
    return o, None
  return o, jnp.concatenate([jnp.swapaxes(final_v, -1, -2),
                             final_z[..., None]], axis=-1)
