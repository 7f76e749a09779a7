"""The token-by-token scan of Gated DeltaNet, built on
``recurrent_delta_rule``."""

from lin_attn_jax.ops.delta_rule.recurrent import recurrent_delta_rule
from lin_attn_jax.ops.gated_delta_rule.inputs import GATED_DELTA_RULE

recurrent_gated_delta_rule = GATED_DELTA_RULE.form(
    recurrent_delta_rule, __name__, doc="""\
``gated_delta_rule_step`` scanned over time; ``g: [B, T, HV]``.
""")
