"""The quadratic form of Based, built on ``parallel_linear_attn``."""

from lin_attn_jax.ops.linear_attn.parallel import parallel_linear_attn
from lin_attn_jax.ops.based.inputs import BASED

parallel_based = BASED.form(
    parallel_linear_attn, __name__, doc="""\
Quadratic masked form; arguments as in ``chunk_based``.
""")
