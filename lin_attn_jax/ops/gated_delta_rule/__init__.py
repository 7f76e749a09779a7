"""Gated DeltaNet on the delta-rule core (scalar log-decay per head)."""

from lin_attn_jax.ops.gated_delta_rule.forms import (
    chunk_gated_delta_rule, gated_delta_rule_step,
    naive_recurrent_gated_delta_rule, parallel_gated_delta_rule,
    recurrent_gated_delta_rule)

__all__ = [
    "chunk_gated_delta_rule",
    "gated_delta_rule_step",
    "naive_recurrent_gated_delta_rule",
    "parallel_gated_delta_rule",
    "recurrent_gated_delta_rule",
]
