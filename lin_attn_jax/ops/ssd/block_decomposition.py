"""Mamba-2's SSD block decomposition in XLA, ``B`` and ``C`` kept per group.

The GLA core's chunk form (``chunk_gated_linear``) serves SSD through the
mapping ``q = C, k = B, v = x dt, g = dt A``, which copies ``B`` and ``C``
to every head and scales ``q`` and ``k`` by per-head decays. Here, as in
Mamba-2's own SSD algorithm (https://arxiv.org/abs/2405.21060, section 7),
the decays act on the value side, so ``B`` and ``C`` enter the matmuls once
per group:

1. Log-decay sums inside each chunk (``chunk_log_decays``: from the chunk
   start to i, from after j to the chunk end, the whole chunk).
2. Chunk states ``sum_j B_j (exp(to_end_j) x_j dt_j)^T`` (last document
   only): one ``[N, C] x [C, R P]`` matmul per group; then a ``lax.scan``
   over chunks for the state entering each.
3. Outputs: ``C_i . B_j`` once per group, times each head's ``[C, C]``
   decay matrix (exact pairwise sums, masked before ``exp``, as in
   ``gated_linear/scalar_decay.py``), times the values; plus
   ``exp(to_here_i) C_i . S`` (no document start before i in the chunk).

The results are those of ``chunk_gated_linear`` under the mapping (same
sums, same masks); only the order of the products differs.

Letters: b batch, n chunk, g group, r head within a group, i and j position
in a chunk, k state entry (N), p head channel (P).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.decay import chunk_log_decays
from lin_attn_jax.ops.common.segments import chunk_documents
from lin_attn_jax.ops.gated_linear.scalar_decay import chunk_pairwise_sums

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


# Rows scaled by a per-token factor are written as einsums too: autodiff of
# a broadcast multiply gives a multiply and a reduction for the factor's
# gradient, which XLA:CPU runs several times slower than a dot_general.


def chunk_ssd_xla(x, step, A, B, C, *, initial_state, output_final_state,
                  segment_ids, chunk_size, sub_chunk_size):
  """The chunk form on validated inputs.

  Args:
    x: ``[B, T, H, P]``; step: ``[B, T, H]`` float32, the time step after
    bias and softplus; A: ``[H]``; B, C: ``[B, T, G, N]``; initial_state:
    ``[B, H, N, P]`` or None; chunk_size, sub_chunk_size: as in
    ``chunk_ssd``.
  Returns:
    ``(y [B, T, H, P] float32 without the skip, final state or None)``.
  """
  batch, length, heads, head_dim = x.shape
  groups, n_state = B.shape[2:]
  per_group = heads // groups
  sub = min(sub_chunk_size, chunk_size)
  chunk = min(chunk_size, -(-length // sub) * sub)
  v = _mm("bthp,bth->bthp", jnp.asarray(x, _F32), step)        # [B, T, H, P]
  g = step * jnp.asarray(A, _F32)                               # [B, T, H]
  v, g, k, q = (pad_time(jnp.asarray(a, _F32), chunk)
                for a in (v, g, B, C))
  n = v.shape[1] // chunk
  v_c = v.reshape(batch, n, chunk, groups, per_group, head_dim).transpose(
      0, 1, 3, 4, 2, 5)                                         # [B,n,G,R,C,P]
  g_c = g.reshape(batch, n, chunk, groups, per_group).transpose(
      0, 1, 3, 4, 2)                                            # [B,n,G,R,C]
  k_c, q_c = (a.reshape(batch, n, chunk, groups, n_state).transpose(
      0, 1, 3, 2, 4) for a in (k, q))                           # [B,n,G,C,N]
  ids = (jnp.zeros((batch, length), jnp.int32) if segment_ids is None
         else segment_ids)
  doc_c, doc_before = chunk_documents(ids, batch, length, chunk)  # [B,n,C], [B,n]

  to_here, to_end, total = chunk_log_decays(g_c, sub, axis=4)
  in_last_doc = (doc_c == doc_c[:, :, -1:])[:, :, None, None, :, None]
  v_end = jnp.where(in_last_doc,
                    _mm("bngrjp,bngrj->bngrjp", v_c, jnp.exp(to_end)), 0.0)
  own = _mm("bngjk,bngrjp->bngrkp", k_c, v_end)                 # [B,n,G,R,N,P]
  passes = (doc_c[:, :, -1] == doc_before)[:, :, None, None]    # [B, n, 1, 1]
  chunk_decay = jnp.where(passes, jnp.exp(total), 0.0)          # [B, n, G, R]

  def carry_state(state, inputs):
    decay, own_n = inputs                                       # [B,G,R], [B,G,R,N,P]
    return decay[..., None, None] * state + own_n, state

  state_shape = (batch, groups, per_group, n_state, head_dim)
  state0 = (jnp.zeros(state_shape, _F32) if initial_state is None
            else jnp.asarray(initial_state, _F32).reshape(state_shape))
  final, entering = jax.lax.scan(
      carry_state, state0,
      (jnp.moveaxis(chunk_decay, 1, 0), jnp.moveaxis(own, 1, 0)))
  entering = jnp.moveaxis(entering, 0, 1)                       # [B,n,G,R,N,P]

  mask = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))         # [i, j]
  if segment_ids is not None:
    same_doc = doc_c[:, :, :, None] == doc_c[:, :, None, :]     # [B, n, i, j]
    mask = mask & same_doc[:, :, None, None]                    # [B,n,1,1,i,j]
  decay = jnp.exp(jnp.where(mask, chunk_pairwise_sums(g_c), -jnp.inf))
  scores = _mm("bngik,bngjk->bngij", q_c, k_c)[:, :, :, None] * decay
  o = _mm("bngrij,bngrjp->bngrip", scores, v_c)                 # [B,n,G,R,C,P]
  reached = (doc_c == doc_before[..., None])[:, :, None, None, :, None]
  from_state = _mm("bngik,bngrkp->bngrip", q_c, entering)       # [B,n,G,R,C,P]
  o = o + jnp.where(reached, _mm("bngrip,bngri->bngrip", from_state,
                                 jnp.exp(to_here)), 0.0)
  o = o.transpose(0, 1, 4, 2, 3, 5).reshape(
      batch, n * chunk, heads, head_dim)[:, :length]            # [B, T, H, P]
  final = (final.reshape(batch, heads, n_state, head_dim)
           if output_final_state else None)
  return o, final
