"""Gated DeltaNet's arguments on the delta-rule core: a scalar log-decay per
head, ``g: [B, T, HV]`` (``[B, HV]`` for the step), given before ``beta``."""

from __future__ import annotations

from lin_attn_jax.ops.common.variant import Variant
from lin_attn_jax.ops.delta_rule.inputs import gate_before_beta

GATED_DELTA_RULE = Variant(name="gated_delta_rule",
                           params=("q", "k", "v", "g", "beta"), core_arity=5,
                           to_core=gate_before_beta("[B, T, HV]", "[B, HV]"))
