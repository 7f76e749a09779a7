"""The quadratic form of GLA, built on ``parallel_gated_linear``."""

from lin_attn_jax.ops.gated_linear.parallel import parallel_gated_linear
from lin_attn_jax.ops.gla.inputs import GLA

parallel_gla = GLA.form(
    parallel_gated_linear, __name__, doc="""\
Quadratic masked form; arguments as in ``chunk_gla``.
""")
