"""The delta-rule core.

``S_t = (I - b_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T``.

DeltaNet (``g=None``), Gated DeltaNet (``lin_attn_jax.ops.gated_delta_rule``,
scalar ``g``) and KDA (``lin_attn_jax.ops.kda``, ``g`` per key channel) are
thin parameterisations of these forms. The WY derivation of the chunk form is
in README.md.
"""

from lin_attn_jax.ops.delta_rule.chunk import chunk_delta_rule
from lin_attn_jax.ops.delta_rule.inputs import l2_normalize
from lin_attn_jax.ops.delta_rule.naive import naive_recurrent_delta_rule
from lin_attn_jax.ops.delta_rule.parallel import parallel_delta_rule
from lin_attn_jax.ops.delta_rule.recurrent import recurrent_delta_rule
from lin_attn_jax.ops.delta_rule.step import delta_rule_step

__all__ = [
    "chunk_delta_rule",
    "delta_rule_step",
    "l2_normalize",
    "naive_recurrent_delta_rule",
    "parallel_delta_rule",
    "recurrent_delta_rule",
]
