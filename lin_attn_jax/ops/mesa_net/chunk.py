"""The chunkwise form: the training path.

The sequence is cut into chunks of ``C`` tokens. With ``G_i`` the sum of
the log-decays from the chunk's start to token ``i`` and ``P_ij = exp(sum_{j
< m <= i} g_m)``:

1. ``H^kk`` entering each chunk, ``[B, N, H, K, K]``: the gated-linear
   core's chunk states for the keys ``beta k`` and the values ``k`` (each
   chunk's own end state, then a ``lax.scan`` over chunks). Only these are
   stored, never a ``[K, K]`` matrix per token.
2. ``x_i = (H^kk_i + diag(lamb))^{-1} q_i`` for every token at once, by
   CG (``cg.py``), with ``H^kk_i p`` applied in the chunk form:

       H^kk_i p = exp(G_i) S_n^T p + sum_{j <= i in the chunk, same document}
                  P_ij beta_j (k_j . p) k_j

   (the entering state ``S_n`` read only before any document start in the
   chunk): per iteration one ``[C, C]`` score matmul per chunk and head and
   one read of ``S_n``, as the core's scalar-decay outputs. The pair decays
   are exact sums of their own gates (``chunk_pairwise_sums``), masked
   before ``exp``. Groups of chunks (512 tokens) are solved one after the
   other, so that the iterations of a group run in cache.
3. ``o_i = H^kv_i^T x_i``: the core's ``chunk_gated_linear`` on the query
   ``x``, the keys ``beta k``, the values ``v`` and the log-decays ``g``
   (scale 1), from ``H^kv_0``; it also gives the final ``H^kv`` and takes
   ``impl`` (the core's Pallas kernels for this pass).

Gradients: step 2 is differentiated implicitly (an adjoint CG solve and
``matvec``'s derivative, ``cg.py``), steps 1 and 3 by autodiff (step 3
through the core's own backward pass).

Letters: b batch, n chunk, h head, i and j position in the chunk, k and l
key channels, v value channel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks, context_parallel, dispatch
from lin_attn_jax.ops.common.chunking import (chunk_layout, chunks_per_group,
                                             map_chunk_groups, merge_chunks,
                                             pad_time, split_chunks)
from lin_attn_jax.ops.common.decay import chunk_log_decays
from lin_attn_jax.ops.common.segments import chunk_documents
from lin_attn_jax.ops.gated_linear import chunk_gated_linear
from lin_attn_jax.ops.gated_linear.scalar_decay import chunk_pairwise_sums
from lin_attn_jax.ops.mesa_net import context_parallel as split
from lin_attn_jax.ops.mesa_net.cg import solve
from lin_attn_jax.ops.mesa_net.inputs import (CG_STEPS, query_key,
                                              unpack_mesa_net_state,
                                              validate)

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def entering_states(k_beta_c, values_c, g_c, doc_c, doc_before, state0, *,
                    sub):
  """Step 1: the core's state entering each chunk, and the final state.

  Args:
    k_beta_c: ``[B, N, C, H, K]``; values_c: ``[B, N, C, H, W]``;
    g_c: ``[B, N, C, H]``; doc_c: ``[B, N, C]`` document index;
    doc_before: ``[B, N]`` document of the token before each chunk;
    state0: ``[B, H, K, W]`` float32.
  Returns:
    ``(entering [B, N, H, K, W], final [B, H, K, W])``.
  """
  _, to_end, total = chunk_log_decays(g_c[..., None], sub, axis=2)
  in_last_doc = (doc_c == doc_c[:, :, -1:])[..., None, None]   # [B,N,C,1,1]
  k_to_end = jnp.where(in_last_doc, k_beta_c * jnp.exp(to_end), 0.0)
  own = _mm("bnjhk,bnjhl->bnhkl", k_to_end, values_c)           # [B,N,H,K,W]
  passes = (doc_c[:, :, -1] == doc_before)[..., None, None]     # [B, N, 1, 1]
  decay = jnp.where(passes, jnp.exp(total), 0.0)                # [B, N, H, 1]

  def carry(state, inputs):
    decay_n, own_n = inputs                                     # [B,H,1], [B,H,K,W]
    return decay_n[..., None] * state + own_n, state

  final, entering = jax.lax.scan(
      carry, state0, (jnp.moveaxis(decay, 1, 0), jnp.moveaxis(own, 1, 0)))
  return jnp.moveaxis(entering, 0, 1), final


def chunk_solve(q, k, beta, g, lamb, h_kk0, segment_ids, *, chunk, sub,
                cg_steps):
  """Steps 1 and 2: ``x [B, T, H, K]`` float32 and the final ``H^kk [B, H,
  K, K]``.

  q, k: ``[B, T, H, K]`` float32; beta, g: ``[B, T, H]`` float32;
  lamb: ``[H, K]``; h_kk0: ``[B, H, K, K]``; T padded here to whole chunks
  (padding tokens have ``q = k = 0`` and ``g = 0``: their systems are
  ``x = 0`` and they write nothing).
  """
  b, t, h, dk = q.shape
  q, k, beta, g = (pad_time(x, chunk) for x in (q, k, beta, g))
  doc_c, doc_before = chunk_documents(
      jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids,
      b, t, chunk)                                              # [B,N,C], [B,N]
  q_c, k_c, beta_c, g_c = (split_chunks(x, chunk) for x in (q, k, beta, g))
  k_beta_c = beta_c[..., None] * k_c                            # [B,N,C,H,K]
  entering, final = entering_states(k_beta_c, k_c, g_c, doc_c, doc_before,
                                    h_kk0, sub=sub)

  heads_first = lambda x: jnp.moveaxis(x, 3, 2)                 # [B,N,H,C,*]
  k_h, g_h, beta_h = heads_first(k_c), heads_first(g_c), heads_first(beta_c)
  causal = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))       # [i, j]
  same_doc = doc_c[:, :, :, None] == doc_c[:, :, None, :]       # [B,N,i,j]
  mask = (causal & same_doc)[:, :, None]                        # [B,N,1,i,j]
  pairs = jnp.exp(jnp.where(mask, chunk_pairwise_sums(g_h), -jnp.inf))
  pairs = pairs * beta_h[..., None, :]                          # [B,N,H,i,j]
  reached = (doc_c == doc_before[..., None])[:, :, None, :, None]
  read = jnp.where(reached, jnp.exp(jnp.cumsum(g_h, axis=3))[..., None],
                   0.0)                                         # [B,N,H,C,1]
  lamb = jnp.asarray(lamb, _F32)[:, None, :]                    # [H, 1, K]

  def solve_chunks(q_h, k_h, pairs, read, entering):
    def matvec(p):                                              # [B,N,H,C,K]
      scores = _mm("bnhik,bnhjk->bnhij", p, k_h) * pairs
      return (_mm("bnhij,bnhjk->bnhik", scores, k_h)
              + _mm("bnhik,bnhkl->bnhil", read * p, entering) + lamb * p)
    return solve(matvec, q_h, cg_steps)

  # Not rematerialised: the backward pass needs the solution, which a
  # recomputation would solve again.
  x = map_chunk_groups(solve_chunks,
                       (heads_first(q_c), k_h, pairs, read, entering),
                       chunks_per_group(chunk), remat=False)    # [B,N,H,C,K]
  x = merge_chunks(jnp.moveaxis(x, 2, 3))[:, :t]                # [B, T, H, K]
  return x, final


@context_parallel.splits_sequence(
    lambda: split.context_parallel_mesa_net)
def chunk_mesa_net(q, k, v, g, beta, lamb, *, initial_state=None,
                   output_final_state=False, segment_ids=None,
                   cg_steps=CG_STEPS, use_qk_l2norm=False, chunk_size=64,
                   sub_chunk_size=8, impl="auto"):
  """MesaNet, chunkwise; arguments and result as in
  ``naive_recurrent_mesa_net``.

  chunk_size, sub_chunk_size: tokens per chunk and per sub-chunk of the
    log-decay sums (speed and memory only, not results).
  impl: the core's ``impl`` for the output pass (step 3 of the module
    docstring; ``"pallas"`` runs the core's kernel there). The solve is
    XLA on every backend.

  Memory: the ``[K, K]`` state entering each chunk (``[B, T / C, H, K,
  K]``) and a ``[C, C]`` pair matrix per chunk and head, not a ``[K, K]``
  matrix per token. Under a mesh with a ``sequence`` axis the sequence is
  split over its devices (``context_parallel.py``).

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2), -0.1); beta = jnp.full((1, 100, 2), 0.5)
    >>> lamb = jnp.ones((2, 16))
    >>> o, s = chunk_mesa_net(q, k, v, g, beta, lamb, use_qk_l2norm=True,
    ...                       output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 2, 32), (1, 2, 16, 48))
  """
  b, t, h, dk, dv = validate(q, k, v, g, beta, lamb, initial_state,
                             segment_ids, cg_steps)
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  dispatch.check_impl(impl)
  q, k = query_key(q, k, use_qk_l2norm)
  g, beta = jnp.asarray(g, _F32), jnp.asarray(beta, _F32)
  h_kk0, h_kv0 = (unpack_mesa_net_state(initial_state)
                  if initial_state is not None
                  else (jnp.zeros((b, h, dk, dk), _F32), None))
  chunk, sub = chunk_layout(t, chunk_size, sub_chunk_size)
  x, final_kk = chunk_solve(q, k, beta, g, lamb, h_kk0, segment_ids,
                            chunk=chunk, sub=sub, cg_steps=cg_steps)
  o, final_kv = chunk_gated_linear(
      x, beta[..., None] * k, v, g, scale=1.0, initial_state=h_kv0,
      output_final_state=output_final_state, segment_ids=segment_ids,
      chunk_size=chunk_size, sub_chunk_size=sub_chunk_size, impl=impl)
  if not output_final_state:
    return o, None
  return o, jnp.concatenate([final_kk, final_kv], axis=-1)

