"""Gated DeltaNet: the delta-rule core with a scalar log-decay per head.

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (scale * q_t)

Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with
Delta Rule" (https://arxiv.org/abs/2412.06464). The argument order
``(q, k, v, g, beta)`` is the usual one for this op; shapes, options and
returns are those of ``lin_attn_jax.ops.delta_rule.chunk_delta_rule`` with
``g: [B, T, HV]`` (``[B, HV]`` for the step).
"""

from lin_attn_jax.ops.gated_delta_rule.naive import (
    naive_recurrent_gated_delta_rule)
from lin_attn_jax.ops.gated_delta_rule.parallel import parallel_gated_delta_rule
from lin_attn_jax.ops.gated_delta_rule.chunk import chunk_gated_delta_rule
from lin_attn_jax.ops.gated_delta_rule.recurrent import (
    recurrent_gated_delta_rule)
from lin_attn_jax.ops.gated_delta_rule.step import gated_delta_rule_step

__all__ = [
    "chunk_gated_delta_rule",
    "gated_delta_rule_step",
    "naive_recurrent_gated_delta_rule",
    "parallel_gated_delta_rule",
    "recurrent_gated_delta_rule",
]
