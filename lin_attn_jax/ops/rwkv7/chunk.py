"""RWKV-7, chunkwise, with the WY representation of its rank-one updates.

Inside a chunk, with ``x_i = S_{i-1}^T a_i`` the value that the rank-one term
reads and ``S_in`` the entering state (derivation in README.md):

1. Log-decays from the chunk start and to the chunk end, by the doubling
   whose levels the halving of step 2 uses.
2. Intra-chunk score matrices by halving (``common.chunk_scores``, one
   matmul per block of a level for all four, no ``[C, C, K]`` tensor; or,
   with ``min_log_decay`` and short enough chunks, one matmul of factors
   scaled from the chunk's start):
   strictly causal (reading the state before i) ``A_ab``, ``A_ak`` with a
   as the query, causal ``P_rb``, ``P_rk`` with r as the query; all masked
   to one document.
3. WY: ``[W | U] = (I - A_ab)^{-1} [exp(G_{i-1}) * A | A_ak V]`` (one small
   unit-lower-triangular inverse per chunk, ``invert_unit_lower``); then
   ``X = W S_in + U``.
4. Chunk transitions ``S_out = (D + B_end^T W) S_in + B_end^T U + K_end^T V``
   and a ``lax.scan`` over chunks.
5. Outputs ``o = (exp(G) * R) S_in + P_rb X + P_rk V``, taken as ``o =
   (P_rb U + P_rk V) + (exp(G) * R + P_rb W) S_in`` so that only ``[C, K]``
   and ``[C, V]`` terms of a chunk, not its ``[C, C]`` scores, outlive the
   chunk-local stage.

Letters as in ``delta_rule/chunk.py``.
"""

from __future__ import annotations

import functools
import numbers

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks, context_parallel
from lin_attn_jax.ops.common.chunk_scores import intra_chunk_scores
from lin_attn_jax.ops.common.chunking import (chunk_layout, chunks_per_group,
                                             map_chunk_groups, merge_chunks,
                                             pad_time, split_chunks)
from lin_attn_jax.ops.common.decay import shift
from lin_attn_jax.ops.common.products import mm_nn, mm_tn
from lin_attn_jax.ops.common.segments import chunk_documents
from lin_attn_jax.ops.delta_rule.chunk import (document_masks,
                                               invert_unit_lower,
                                               scan_chunk_states)
from lin_attn_jax.ops.rwkv7 import context_parallel as split
from lin_attn_jax.ops.rwkv7.inputs import default_scale, validate

_F32 = jnp.float32

def _chunk_local(r_h, w_h, k_h, v_h, a_h, b_h, *docs, min_log_decay=None):
  """Steps 1-3, each chunk's transition and the state-free part of step 5.

  Args:
    r_h, w_h, k_h, a_h, b_h: ``[B, N, H, C, K]`` (r scaled); v_h: ``[B, N,
      H, C, V]``; docs: ``chunk_documents`` (``doc_c, doc_before``) or none.
    min_log_decay: as in ``chunk_rwkv7`` (``w_h`` already raised to it).
  Returns:
    ``decay [B, N, H, K]`` and ``b_w [B, N, H, K, K]`` (the transition is
    ``diag(decay) + b_w``), ``own [B, N, H, K, V]``, ``reads [B, N, H, C,
    K]`` and ``o_local [B, N, H, C, V]``: the output is ``o_local + reads
    S_in``.
  """
  same_doc, reached, in_last_doc, passes = document_masks(docs or None)
  dk = r_h.shape[-1]

  # Steps 1 and 2: intra-chunk scores, [B, N, H, C, C] each, and the
  # log-decays from the chunk start to i (and to i - 1) and from j to the
  # chunk end, [B, N, H, C, K].
  scores, (from_start, to_end, total) = intra_chunk_scores(
      (a_h, r_h), (b_h, k_h), w_h, strict=(True, False), with_decays=True,
      min_log_decay=min_log_decay)
  (a_b, a_k), (r_b, r_k) = ([jnp.where(same_doc, s, 0.0) for s in row]
                            for row in scores)
  before = shift(from_start, 1, axis=-2)

  # Step 3: W and U from one triangular inverse per chunk.
  a_from_start = jnp.where(reached, a_h * jnp.exp(before), 0.0)  # [B,N,H,C,K]
  rhs = jnp.concatenate([a_from_start, mm_nn(a_k, v_h)],
                        axis=-1)                                # [B,N,H,C,K+V]
  wu = mm_nn(invert_unit_lower(-a_b), rhs)             # [W | U], [B,N,H,C,K+V]

  # Step 4 (its chunk-local part): the chunk transitions.
  decay_to_end = jnp.where(in_last_doc, jnp.exp(to_end), 0.0)   # [B,N,H,C,K]
  b_to_end, k_to_end = b_h * decay_to_end, k_h * decay_to_end
  decay = jnp.where(passes, jnp.exp(total), 0.0)                # [B,N,H,K]
  # The transition is diag(decay) + b_w.
  b_w, b_u = jnp.split(mm_tn(b_to_end, wu), [dk], axis=-1)      # [B,N,H,K,*]
  own = b_u + mm_tn(k_to_end, v_h)                              # [B,N,H,K,V]
  # Step 5 (its chunk-local part): o = o_local + reads S_in, with
  # X = W S_in + U. Only [C, K] and [C, V] terms leave the chunk.
  r_from_start = jnp.where(reached, r_h * jnp.exp(from_start), 0.0)
  r_w, r_u = jnp.split(mm_nn(r_b, wu), [dk], axis=-1)
  reads = r_from_start + r_w                                    # [B,N,H,C,K]
  o_local = r_u + mm_nn(r_k, v_h)                               # [B,N,H,C,V]
  return decay, b_w, own, reads, o_local


@context_parallel.splits_sequence(lambda: split.context_parallel_rwkv7)
def chunk_rwkv7(r, w, k, v, a, b, *, scale=None, initial_state=None,
                output_final_state=False, segment_ids=None, chunk_size=64,
                sub_chunk_size=8, min_log_decay=None):
  """RWKV-7 (Goose), chunkwise; the training path.

  ``S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T`` (the
  transpose of RWKV-7's ``S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t
  k_t^T``), ``o_t = S_t^T (scale * r_t)``.

  Args:
    r, k: ``[B, T, H, K]`` receptance and key; v: ``[B, T, H, V]``.
    w: ``[B, T, H, K]`` natural-log decay ``<= 0``.
    a, b: ``[B, T, H, K]`` the rank-one term (RWKV-7 uses ``a = -kappa``,
      ``b = kappa * eta`` with a unit "removal key" kappa and in-context
      learning rate eta, which keeps the transition stable).
    scale: receptance scale, ``K ** -0.5`` when None (RWKV models use 1.0).
    initial_state: ``[B, H, K, V]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk (speed only).
    sub_chunk_size: divides ``chunk_size``; a sequence shorter than a chunk
      is one chunk of whole sub-chunks of this many tokens (speed only).
    min_log_decay: None, or a Python float ``< 0`` below which no ``w``
      falls: ``w`` is raised to it where lower. With chunks of at most
      ``chunk_scores.MAX_FACTORED_SPAN / -min_log_decay`` tokens the
      intra-chunk scores are then one matmul of factors scaled from the
      chunk's start instead of the halving (``common.chunk_scores``): the
      RWKV-7 layer's decays are above ``-exp(-0.5)`` by construction, 64
      tokens at most. Speed only, for ``w`` above the bound.
  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state [B, H, K, V] float32 or
    None)``.

  Example:
    >>> r = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> w = jnp.full((1, 100, 2, 16), -0.1)
    >>> kappa = jnp.full((1, 100, 2, 16), 0.25)
    >>> o, _ = chunk_rwkv7(r, w, k, v, -kappa, 0.5 * kappa, scale=1.0)
    >>> o.shape
    (1, 100, 2, 32)
  """
  bs, t, h, dk, dv = validate(r, w, k, v, a, b, initial_state, segment_ids)
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  scale = default_scale(scale, dk)
  if min_log_decay is not None and not (
      isinstance(min_log_decay, numbers.Real) and min_log_decay < 0):
    raise ValueError(f"min_log_decay must be None or a Python float < 0, got "
                     f"{min_log_decay!r}")
  chunk, _ = chunk_layout(t, chunk_size, sub_chunk_size)
  out_dtype = v.dtype
  r, w, k, v, a, b = (pad_time(jnp.asarray(x, _F32), chunk)
                      for x in (r, w, k, v, a, b))
  if min_log_decay is not None:
    # A where, not a maximum: the gradient passes whole at the bound.
    w = jnp.where(w < min_log_decay, _F32(min_log_decay), w)
  docs = chunk_documents(segment_ids, bs, t, chunk)

  def head_major(x):                                            # [B,N,H,C,*]
    return jnp.moveaxis(split_chunks(x, chunk), 3, 2)

  # Steps 1-4 (chunk-local), over groups of chunks. The inputs are moved
  # to the head-major layout once, here: inside the groups the move would
  # be fused into every consumer, and its index arithmetic makes those
  # kernels several times slower to compile.
  v_h = head_major(v)                                           # [B,N,H,C,V]
  decay, b_w, own, reads, o_local = map_chunk_groups(
      functools.partial(_chunk_local, min_log_decay=min_log_decay),
      tuple(head_major(x) for x in (scale * r, w, k)) + (v_h,)
      + tuple(head_major(x) for x in (a, b)) + (docs or ()),
      chunks_per_group(chunk))

  # Step 4: the state entering every chunk.
  state0 = (jnp.zeros((bs, h, dk, dv), _F32) if initial_state is None
            else jnp.asarray(initial_state, _F32))
  final_state, entering = scan_chunk_states(b_w, own, state0, decay)

  # Step 5: outputs.
  o = o_local + mm_nn(reads, entering)                          # [B,N,H,C,V]
  o = merge_chunks(jnp.moveaxis(o, 2, 3))[:, :t]                # [B,T,H,V]
  return o.astype(out_dtype), (final_state if output_final_state else None)
