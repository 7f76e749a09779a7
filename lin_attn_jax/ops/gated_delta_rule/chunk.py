"""The chunkwise form of Gated DeltaNet, built on ``chunk_delta_rule``."""

from lin_attn_jax.ops.delta_rule.chunk import chunk_delta_rule
from lin_attn_jax.ops.gated_delta_rule.inputs import GATED_DELTA_RULE

chunk_gated_delta_rule = GATED_DELTA_RULE.form(
    chunk_delta_rule, __name__, doc="""\
Chunkwise form (WY representation), the training path.

Args:
  q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV]`` log-decay
    ``<= 0``; beta: ``[B, T, HV]``.
  scale, initial_state, output_final_state, segment_ids, chunk_size,
    sub_chunk_size, use_qk_l2norm, impl: as in ``chunk_delta_rule``
    (``impl="pallas"``: the sweep over chunks and its backward pass as
    Pallas kernels, the WY terms in XLA).
Returns:
  ``(o [B, T, HV, V], final_state [B, HV, K, V] or None)``.

Example:
  >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
  >>> g = jnp.full((1, 100, 2), -0.1); beta = jnp.full((1, 100, 2), 0.5)
  >>> o, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
  >>> o.shape
  (1, 100, 2, 32)
""")
