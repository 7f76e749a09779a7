"""The reference recurrence of Gated DeltaNet, built on
``naive_recurrent_delta_rule``."""

from lin_attn_jax.ops.delta_rule.naive import naive_recurrent_delta_rule
from lin_attn_jax.ops.gated_delta_rule.inputs import GATED_DELTA_RULE

naive_recurrent_gated_delta_rule = GATED_DELTA_RULE.form(
    naive_recurrent_delta_rule, __name__, doc="""\
Reference recurrence; ``g: [B, T, HV]``.
""")
