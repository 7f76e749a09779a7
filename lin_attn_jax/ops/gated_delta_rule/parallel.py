"""The quadratic form of Gated DeltaNet, built on ``parallel_delta_rule``."""

from lin_attn_jax.ops.delta_rule.parallel import parallel_delta_rule
from lin_attn_jax.ops.gated_delta_rule.inputs import GATED_DELTA_RULE

parallel_gated_delta_rule = GATED_DELTA_RULE.form(
    parallel_delta_rule, __name__, doc="""\
Quadratic form; ``g: [B, T, HV]``.
""")
