"""The quadratic form of RetNet retention, built on
``parallel_gated_linear``."""

from lin_attn_jax.ops.gated_linear.parallel import parallel_gated_linear
from lin_attn_jax.ops.retention.inputs import RETENTION

parallel_retention = RETENTION.form(
    parallel_gated_linear, __name__, doc="""\
Quadratic masked form (RetNet's parallel representation).
""")
