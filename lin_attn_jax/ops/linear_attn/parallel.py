"""The quadratic form of linear attention, built on
``parallel_gated_linear``."""

from lin_attn_jax.ops.gated_linear.parallel import parallel_gated_linear
from lin_attn_jax.ops.linear_attn.inputs import LINEAR_ATTN

parallel_linear_attn = LINEAR_ATTN.form(
    parallel_gated_linear, __name__, doc="""\
Quadratic masked form; arguments as in ``chunk_linear_attn``.
""")
