"""The chunkwise form of Gated DeltaProduct: ``chunk_delta_rule`` on the
interleaved sub-steps (the training path)."""

from __future__ import annotations

from lin_attn_jax.ops.delta_rule.chunk import chunk_delta_rule
from lin_attn_jax.ops.gated_delta_product.inputs import on_core, validate


def chunk_gated_delta_product(q, k, v, g, beta, *, scale=None,
                              initial_state=None, output_final_state=False,
                              segment_ids=None, chunk_size=64,
                              sub_chunk_size=8, use_qk_l2norm=False,
                              impl="auto"):
  """Chunkwise form (WY representation of the delta-rule core).

  The ``T`` tokens of ``N`` sub-steps each run as ``T N`` tokens of
  ``chunk_delta_rule`` (``inputs.interleave``): the decay on each token's
  first sub-step, its query on the last, whose outputs are the op's. Under a
  mesh with a ``"sequence"`` axis the core splits the interleaved sequence
  itself; device ``p``'s ``T N / P`` sub-steps are exactly its ``T / P``
  tokens'.

  Args:
    q, k, v, g, beta, scale, initial_state, output_final_state, segment_ids,
      use_qk_l2norm: as in ``naive_recurrent_gated_delta_product``.
    chunk_size, sub_chunk_size: chunk lengths of the core, counted in
      sub-steps (``chunk_size=64`` is ``64 / N`` tokens, as in fla); speed
      only.
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the core's sweep over
      chunks (see ``chunk_delta_rule``).
  Returns:
    ``(o [B, T, HV, V] in v's dtype, final state [B, HV, K, V] float32 or
    None)``.

  Example:
    >>> q = jnp.ones((1, 50, 2, 16)); k = jnp.ones((1, 50, 2, 2, 16))
    >>> v = jnp.ones((1, 50, 2, 2, 32)); beta = jnp.full((1, 50, 2, 2), 0.5)
    >>> g = jnp.full((1, 50, 2), -0.1)
    >>> o, _ = chunk_gated_delta_product(q, k, v, g, beta,
    ...                                  use_qk_l2norm=True)
    >>> o.shape
    (1, 50, 2, 32)
  """
  validate(q, k, v, g, beta, initial_state, segment_ids)
  return on_core(chunk_delta_rule, q, k, v, g, beta, scale=scale,
                 initial_state=initial_state,
                 output_final_state=output_final_state,
                 segment_ids=segment_ids, chunk_size=chunk_size,
                 sub_chunk_size=sub_chunk_size, use_qk_l2norm=use_qk_l2norm,
                 impl=impl)
