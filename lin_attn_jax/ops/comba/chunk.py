"""Comba, chunkwise: the delta-rule core's WY form with the erase key
``beta * p``, read before the decay, and the written value ``beta * v``
(README.md).

Per chunk the pseudo-values that token i writes, ``u_i = beta_i v_i -
S_{i-1}^T (beta_i p_i)``, solve one unit-lower-triangular system whose rows
are the erase keys ``beta_i p_i`` and whose columns are the written keys
``k_j``; everything else is the core's: steps 1-3 are
``delta_rule.chunk.chunk_terms`` with these inputs and
``read_before_decay=True``, steps 4-5 ``delta_rule.chunk.sweep_forms``.

1. and 2. Intra-chunk scores (``common.chunk_scores``, from pairwise sums
   of the scalar gates) with the log-decays from the chunk start and to its
   end: ``A[i, j] = beta_i exp(G_{i-1} - G_j) p_i . k_j`` for ``j < i``
   (the strict rows: the gates of ``j < m < i``) and ``P[i, j] = exp(G_i -
   G_j) q_i . k_j`` for ``j <= i``, masked to one document.
3. WY: ``[W | U] = (I + A)^{-1} diag(beta) [exp(G_{i-1}) P | V]`` (the
   core's ``invert_unit_lower``).
4. and 5. The core's sweep over chunks from these terms (``ChunkTerms``):
   ``S_out = (exp(G_C) - K_end^T W) S_in + K_end^T U`` and ``o = (exp(G) Q)
   S_in + P (U - W S_in)``, in XLA (``delta_rule.chunk.sweep_xla``) or as
   the core's Pallas sweep kernels (``pallas_kernels.delta_rule``).

Letters as in ``delta_rule/chunk.py``.
"""

from __future__ import annotations

from lin_attn_jax.ops.comba import context_parallel as split
from lin_attn_jax.ops.comba.inputs import core_inputs, default_scale, validate
from lin_attn_jax.ops.common import context_parallel
from lin_attn_jax.ops.delta_rule.chunk import chunk_erase_write


@context_parallel.splits_sequence(lambda: split.context_parallel_comba)
def chunk_comba(q, k, v, p, g, beta, *, scale=None, initial_state=None,
                output_final_state=False, segment_ids=None, chunk_size=64,
                sub_chunk_size=8, use_qk_l2norm=False, impl="auto"):
  """Comba, chunkwise (the core's WY form); the training path.

  ``S_t = (exp(g_t) I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T``,
  ``o_t = S_t^T (scale * q_t)``: the state is read along p before the
  decay and written along k (``naive_recurrent_comba``).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``, ``HV`` a multiple of ``H``
      (value head j uses query/key head ``j // (HV // H)``).
    p: ``[B, T, H, K]`` the erase key (the state is read along p and written
      along k).
    g: ``[B, T, HV]`` natural-log decay ``<= 0``, one per head.
    beta: ``[B, T, HV]`` writing strength.
    scale: query scale, ``K ** -0.5`` when None.
    initial_state: ``[B, HV, K, V]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk (speed only).
    sub_chunk_size: divides ``chunk_size``; a sequence shorter than a chunk
      is one chunk of whole sub-chunks of this many tokens (speed only).
    use_qk_l2norm: L2-normalise q, k and p inside the op (as
      flash-linear-attention's ``use_qk_l2norm_in_kernel``).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``
      (``lin_attn_jax.ops.common.dispatch``): the sweep over chunks (steps
      4-5) in XLA or as the delta-rule core's Pallas sweep kernels
      (``pallas_kernels.delta_rule.chunk_delta_rule_sweep``, bfloat16
      matmul operands when q, k and v are bfloat16); steps 1-3 run in XLA
      either way. The core's chunk-parallel kernels (CUDA and TPU) take
      ``beta``, not an erase key, and are not used.
  Returns:
    ``(o [B, T, HV, V] in v's dtype, final_state [B, HV, K, V] float32 or
    None)``.

  Example:
    >>> q = k = p = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2), -0.1); beta = jnp.full((1, 100, 2), 0.5)
    >>> o, s = chunk_comba(q, k, v, p, g, beta, use_qk_l2norm=True,
    ...                    output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 2, 32), (1, 2, 16, 32))
  """
  _, t, _, hv, dk, _, g = validate(q, k, v, p, g, beta, initial_state,
                                   segment_ids)
  return chunk_erase_write(
      (q, k, v), core_inputs(q, k, v, p, g, beta, hv, use_qk_l2norm),
      scale=default_scale(scale, dk), length=t, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      chunk_size=chunk_size, sub_chunk_size=sub_chunk_size, impl=impl,
      read_before_decay=True)
