"""The quadratic form of Kimi Delta Attention, built on
``parallel_delta_rule``."""

from lin_attn_jax.ops.delta_rule.parallel import parallel_delta_rule
from lin_attn_jax.ops.kda.inputs import KDA

parallel_kda = KDA.form(
    parallel_delta_rule, __name__, doc="""\
Quadratic form; ``g: [B, T, HV, K]``.
""")
