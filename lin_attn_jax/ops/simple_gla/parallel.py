"""The quadratic form of simple GLA, built on ``parallel_gated_linear``."""

from lin_attn_jax.ops.gated_linear.parallel import parallel_gated_linear
from lin_attn_jax.ops.simple_gla.inputs import SIMPLE_GLA

parallel_simple_gla = SIMPLE_GLA.form(
    parallel_gated_linear, __name__, doc="""\
Quadratic masked form; arguments as in ``chunk_simple_gla``.
""")
