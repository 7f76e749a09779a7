"""The chunkwise form of Kimi Delta Attention, built on ``chunk_delta_rule``."""

from lin_attn_jax.ops.delta_rule.chunk import chunk_delta_rule
from lin_attn_jax.ops.kda.inputs import KDA

chunk_kda = KDA.form(
    chunk_delta_rule, __name__, doc="""\
Chunkwise form (WY representation), the training path: arguments,
options and returns as in ``chunk_gated_delta_rule``, with a log-decay per
key channel, ``g: [B, T, HV, K]`` (``<= 0``).

Example:
  >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
  >>> g = jnp.full((1, 100, 2, 16), -0.1); beta = jnp.full((1, 100, 2), 0.5)
  >>> o, _ = chunk_kda(q, k, v, g, beta, use_qk_l2norm=True)
  >>> o.shape
  (1, 100, 2, 32)
""")
