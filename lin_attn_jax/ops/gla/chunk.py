"""The chunkwise form of GLA, built on ``chunk_gated_linear``."""

from lin_attn_jax.ops.gated_linear.chunk import chunk_gated_linear
from lin_attn_jax.ops.gla.inputs import GLA

chunk_gla = GLA.form(
    chunk_gated_linear, __name__, doc="""\
Chunkwise GLA.

Args:
  q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
  g: log-decay per key channel ``[B, T, H, K]``, ``<= 0``.
  scale, initial_state ``[B, H, K, V]``, output_final_state, segment_ids
    ``[B, T]``, chunk_size, impl: as in ``chunk_gated_linear``.
Returns:
  ``(o [B, T, H, V], final_state [B, H, K, V] or None)``.

Example:
  >>> import jax, jax.numpy as jnp
  >>> q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (1, 63, 2, 16))
  ...            for i in range(3))
  >>> g = jax.nn.log_sigmoid(jax.random.normal(jax.random.PRNGKey(3),
  ...                                          (1, 63, 2, 16)))
  >>> o, state = chunk_gla(q, k, v, g, output_final_state=True)
  >>> o.shape, state.shape
  ((1, 63, 2, 16), (1, 2, 16, 16))
""")
