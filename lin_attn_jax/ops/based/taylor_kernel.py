"""Based's chunk algorithm in XLA: the Taylor kernel evaluated from ``q . k``.

The Taylor features ``phi(x) = [1, y, vec(y y^T) / sqrt(2)]`` (``y = sqrt(s)
x``, ``1 + K + K^2`` wide, 273 for ``K = 16``) are only needed for the
state. Inside a chunk the kernel itself is cheaper:

    phi(q_i) . phi(k_j) = 1 + a_ij + a_ij^2 / 2,   a_ij = y_i . y_j,

one ``[C, C]`` matmul over ``K`` channels instead of over ``1 + K + K^2``.
The state ``S = sum_j phi(k_j) [v_j, 1]^T`` is kept over the rows ``[1,
y, y_i y_j for the pairs i <= j]`` (``1 + K + K (K + 1) / 2``, 153 for ``K
= 16``): the symmetric part of ``vec(y y^T)``, all that a query reads, with
the query's pair products weighted 1/2 on the diagonal and 1 off it. The
state is kept transposed, ``[V, R]``, so that the products that make and
read it contract the last axis of their left operand (``ops/common/
products.py``), and every chunk tensor is laid out heads first (``[B, H, N,
C, ...]``), the layout of its matmuls. Without documents the states entering
the chunks are a prefix sum over chunks; with them, a ``lax.scan`` that
stops a state where a document starts.

Letters: b batch, h head, n chunk, i and j positions in a chunk, f feature
channel (``K``), e a pair of channels (``K^2``), v value channel (``V + 1``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common.chunking import (merge_chunks, pad_time,
                                             split_chunks)
from lin_attn_jax.ops.common.products import mm_nn, mm_nt, transposed
from lin_attn_jax.ops.common.segments import (chunk_documents,
                                             same_document_mask)

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def _select(subscripts, *operands):
  """A product with a 0/1 matrix: exact at any backend's matmul precision."""
  return jnp.einsum(subscripts, *operands, precision=jax.lax.Precision.HIGHEST,
                    preferred_element_type=_F32)


def _heads_first(x, chunk):
  """``[B, T, H, ...] -> [B, H, N, C, ...]`` (T a multiple of ``chunk``)."""
  return jnp.moveaxis(split_chunks(x, chunk), 3, 1)


def _pair_tables(dim):
  """The pairs ``i <= j`` of channels and the maps between bases.

  Returns ``(first, second, weight, to_pairs, to_full)``: ``first, second
  [K, P]`` pick ``y_i`` and ``y_j`` of pair ``p`` (``P = K (K + 1) / 2``);
  ``weight [P]`` is 1 on the diagonal and 2 off it, so that
  ``(y . z)^2 = sum_p weight_p y_i y_j z_i z_j``; ``to_pairs [P, K^2]``
  maps the rows ``vec(y y^T) / sqrt(2)`` of ``feature_maps.taylor``'s state
  to sums of ``y_i y_j`` (its symmetric part, all that a query reads) and
  ``to_full [K^2, P]`` maps back.
  """
  i, j = np.triu_indices(dim)
  pairs = np.arange(i.size)
  first = np.zeros((dim, i.size), np.float32)
  second = np.zeros((dim, i.size), np.float32)
  first[i, pairs] = 1.0
  second[j, pairs] = 1.0
  weight = np.where(i == j, 1.0, 2.0).astype(np.float32)
  to_pairs = np.zeros((i.size, dim * dim), np.float32)
  to_pairs[pairs, i * dim + j] = np.where(i == j, math.sqrt(2.0), 0.5 ** 0.5)
  to_pairs[pairs, j * dim + i] = np.where(i == j, math.sqrt(2.0), 0.5 ** 0.5)
  to_full = np.zeros((dim * dim, i.size), np.float32)
  to_full[i * dim + j, pairs] = 0.5 ** 0.5
  to_full[j * dim + i, pairs] = 0.5 ** 0.5
  return first, second, weight, to_pairs, to_full


@jax.custom_vjp
def _pairs(y):
  """``y_i y_j`` for the pairs ``i <= j`` of ``_pair_tables``: ``[..., K]
  -> [..., P]``.

  Forward: ``y`` materialised once, then products of its slices (``y_i``
  times ``y_{i..K-1}``, row by row), which XLA:CPU writes in one pass;
  products with the 0/1 pick tables, as in the gradient, were output-bound
  ``[K, P]`` matmuls several times slower. Gradient: ``dy = (g y_j)
  first^T + (g y_i) second^T``, two products that contract the pair axis
  (autodiff of the slices made one fused kernel of ``K`` shifted reads per
  entry, slower than the tables; see docs/performance.md).
  """
  y = jax.lax.optimization_barrier(y)
  return jnp.concatenate([y[..., i:i + 1] * y[..., i:]
                          for i in range(y.shape[-1])], axis=-1)


def _pairs_fwd(y):
  return _pairs(y), y


def _pairs_bwd(y, g):
  dim = y.shape[-1]
  first, second, _, _, _ = (jnp.asarray(x) for x in _pair_tables(dim))
  i, j = np.triu_indices(dim)
  return (_select("...p,fp->...f", g * y[..., j], first)
          + _select("...p,fp->...f", g * y[..., i], second),)


_pairs.defvjp(_pairs_fwd, _pairs_bwd)


def taylor_chunk(q, k, v_aug, *, scale, initial_state, output_final_state,
                 segment_ids, chunk_size):
  """Unnormalised Taylor linear attention of ``v_aug``, chunkwise.

  Args:
    q, k: ``[B, T, H, K]`` raw (before the feature map); v_aug: ``[B, T, H,
      V]`` float32 (the values with their all-ones normalizer column).
    scale: ``s`` of the Taylor kernel (a Python number).
    initial_state: ``[B, H, 1 + K + K^2, V]`` in the basis of
      ``feature_maps.taylor``, or None.
    output_final_state, segment_ids ``[B, T]`` or None, chunk_size: as in
      ``chunk_based``.
  Returns:
    ``(o [B, T, H, V] float32, final_state or None)``:
    ``o_i = sum_{j <= i, same document} phi(q_i) . phi(k_j) v_aug_j`` plus
    the initial state's part.
  """
  b, t, h, f = q.shape
  chunk = min(chunk_size, t)
  root = math.sqrt(scale)
  _, _, weight, to_pairs, to_full = (jnp.asarray(x) for x in _pair_tables(f))
  y_q, y_k, v_aug = (pad_time(x, chunk) for x in (
      jnp.asarray(q, _F32) * root, jnp.asarray(k, _F32) * root, v_aug))
  y_q, y_k, v_c = (_heads_first(x, chunk) for x in (y_q, y_k, v_aug))
  packed = segment_ids is not None

  a = mm_nt(y_q, y_k)                                           # [B,H,N,C,C]
  mask = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))
  if packed:
    doc_c, doc_before = chunk_documents(segment_ids, b, t, chunk)
    mask = mask & same_document_mask(doc_c, doc_c)[:, None]
    in_last_doc = doc_c == doc_c[:, :, -1:]                     # [B, N, C]
    v_own = jnp.where(in_last_doc[:, None, :, :, None], v_c, 0.0)
  else:
    v_own = v_c
  scores = jnp.where(mask, 1.0 + a + 0.5 * (a * a), 0.0)
  o = mm_nn(scores, v_c)                                        # [B,H,N,C,V]

  # State rows R: 1, y (K), then y_i y_j for the pairs i <= j (P). States
  # are kept transposed, [V, R], so that each product contracts the last
  # axis of its left operand.
  lead = 1 + f
  ones = jnp.ones(y_k.shape[:-1] + (1,), _F32)
  k_rows = jnp.concatenate([ones, y_k, _pairs(y_k)], axis=-1)  # [B,H,N,C,R]
  q_rows = jnp.concatenate([ones, y_q, _pairs(y_q) * (0.5 * weight)],
                           axis=-1)                             # [B,H,N,C,R]
  own = mm_nn(transposed(v_own), k_rows)                        # [B,H,N,V,R]
  if initial_state is None:
    state0 = jnp.zeros(own.shape[:2] + own.shape[3:], _F32)
  else:
    init = jnp.asarray(initial_state, _F32)
    state0 = jnp.swapaxes(jnp.concatenate(
        [init[:, :, :lead],
         _select("pe,bhev->bhpv", to_pairs, init[:, :, lead:])], axis=2),
        -1, -2)                                                 # [B,H,V,R]
  if packed:
    passes = (doc_c[:, :, -1] == doc_before).astype(_F32)       # [B, N]

    def carry(state, inputs):
      passes_n, own_n = inputs
      return passes_n[:, None, None, None] * state + own_n, state

    final, entering = jax.lax.scan(
        carry, state0, (passes.T, jnp.moveaxis(own, 2, 0)))
    entering = jnp.moveaxis(entering, 0, 2)                     # [B,H,N,V,R]
  else:
    totals = jax.lax.associative_scan(jnp.add, own, axis=2)     # [B,H,N,V,R]
    entering = jnp.concatenate(
        [jnp.zeros_like(own[:, :, :1]), totals[:, :, :-1]], axis=2)
    entering = entering + state0[:, :, None]
    final = state0 + totals[:, :, -1]

  read = mm_nt(q_rows, entering)                                # [B,H,N,C,V]
  if packed:
    reached = (doc_c == doc_before[..., None])[:, None, :, :, None]
    read = jnp.where(reached, read, 0.0)
  o = merge_chunks(jnp.moveaxis(o + read, 1, 3))[:, :t]         # [B,T,H,V]
  if not output_final_state:
    return o, None
  final = jnp.swapaxes(final, -1, -2)                           # [B,H,R,V]
  final_pairs = _select("ep,bhpv->bhev", to_full, final[:, :, lead:])
  if initial_state is not None:
    # The antisymmetric part of the initial pair rows is never read: it
    # reaches the final state unchanged unless a document starts.
    init_pairs = init[:, :, lead:].reshape(b, h, f, f, -1)
    skew = 0.5 * (init_pairs - jnp.swapaxes(init_pairs, 2, 3))
    kept = 1.0 if not packed else (doc_c[:, -1, -1] == 0).astype(_F32)[:, None,
                                                                  None, None]
    final_pairs = final_pairs + kept * skew.reshape(final_pairs.shape)
  return o, jnp.concatenate([final[:, :, :lead], final_pairs], axis=2)
