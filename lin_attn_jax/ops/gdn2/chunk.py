"""Gated DeltaNet-2, chunkwise: the delta-rule core's WY form with an erase
key and a written value (README.md).

Per chunk, with the erase key ``e = b * k`` and the written value
``w * v``, the pseudo-values that token i writes, ``u_i = w_i * v_i -
S'_i^T e_i``, solve one unit-lower-triangular system whose rows are the
erase keys; everything else is the core's: steps 1-3 are
``delta_rule.chunk.chunk_terms`` with these inputs, steps 4-5
``delta_rule.chunk.sweep_forms``.

1. and 2. Intra-chunk scores (``common.chunk_scores``, by halving, no
   ``[C, C, K]`` tensor) with the log-decays from the chunk start and to
   its end: ``A[i, j] = e_i . (exp(G_i - G_j) * k_j)`` for ``j < i`` and
   ``P[i, j] = q_i . (exp(G_i - G_j) * k_j)`` for ``j <= i``, masked to one
   document.
3. WY: ``[W | U] = (I + A)^{-1} [exp(G) * E | w * V]`` (the core's
   ``invert_unit_lower``).
4. and 5. The core's sweep over chunks from these terms (``ChunkTerms``):
   ``S_out = (D - K_end^T W) S_in + K_end^T U`` and ``o = (exp(G) * Q) S_in
   + P (U - W S_in)``, in XLA (``delta_rule.chunk.sweep_xla``) or as the
   core's Pallas sweep kernels (``pallas_kernels.delta_rule``).

Letters as in ``delta_rule/chunk.py``.
"""

from __future__ import annotations

from lin_attn_jax.ops.common import context_parallel
from lin_attn_jax.ops.delta_rule.chunk import chunk_erase_write
from lin_attn_jax.ops.gdn2 import context_parallel as split
from lin_attn_jax.ops.gdn2.inputs import core_inputs, default_scale, validate


@context_parallel.splits_sequence(lambda: split.context_parallel_gdn2)
def chunk_gdn2(q, k, v, g, b, w, *, scale=None, initial_state=None,
               output_final_state=False, segment_ids=None, chunk_size=64,
               sub_chunk_size=8, use_qk_l2norm=False, impl="auto"):
  """Gated DeltaNet-2, chunkwise (the core's WY form); the training path.

  ``S_t = (I - k_t (b_t * k_t)^T) diag(exp(g_t)) S_{t-1} + k_t (w_t *
  v_t)^T``, ``o_t = S_t^T (scale * q_t)``.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``, ``HV`` a multiple of ``H``
      (value head j uses query/key head ``j // (HV // H)``).
    g: ``[B, T, HV, K]`` natural-log decay ``<= 0``, per key channel.
    b: ``[B, T, HV, K]`` erase gate (in [0, 1], or [0, 2] for negative
      eigenvalues, with unit keys).
    w: ``[B, T, HV, V]`` write gate.
    scale: query scale, ``K ** -0.5`` when None.
    initial_state: ``[B, HV, K, V]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk (speed only).
    sub_chunk_size: divides ``chunk_size``; a sequence shorter than a chunk
      is one chunk of whole sub-chunks of this many tokens (speed only).
    use_qk_l2norm: L2-normalise q and k inside the op.
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
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2, 16), -0.1)
    >>> b = jnp.full((1, 100, 2, 16), 0.5); w = jnp.full((1, 100, 2, 32), 0.5)
    >>> o, s = chunk_gdn2(q, k, v, g, b, w, use_qk_l2norm=True,
    ...                   output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 2, 32), (1, 2, 16, 32))
  """
  _, t, _, hv, dk, _ = validate(q, k, v, g, b, w, initial_state,
                                segment_ids)
  return chunk_erase_write(
      (q, k, v), core_inputs(q, k, v, g, b, w, hv, use_qk_l2norm),
      scale=default_scale(scale, dk), length=t, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      chunk_size=chunk_size, sub_chunk_size=sub_chunk_size, impl=impl)
