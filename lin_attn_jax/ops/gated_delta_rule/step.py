"""One decoding step of Gated DeltaNet, built on ``delta_rule_step``."""

from lin_attn_jax.ops.delta_rule.step import delta_rule_step
from lin_attn_jax.ops.gated_delta_rule.inputs import GATED_DELTA_RULE

gated_delta_rule_step = GATED_DELTA_RULE.form(
    delta_rule_step, __name__, doc="""\
One decoding step; ``g: [B, HV]``, options ``scale, reset,
use_qk_l2norm``. Returns ``(o [B, HV, V], state [B, HV, K, V])``.
""")
