"""KDA's arguments on the delta-rule core: a log-decay per key channel,
``g: [B, T, HV, K]`` (``[B, HV, K]`` for the step), given before ``beta``."""

from __future__ import annotations

from lin_attn_jax.ops.common.variant import Variant
from lin_attn_jax.ops.delta_rule.inputs import gate_before_beta

KDA = Variant(name="kda", params=("q", "k", "v", "g", "beta"), core_arity=5,
              to_core=gate_before_beta("[B, T, HV, K]", "[B, HV, K]"))
