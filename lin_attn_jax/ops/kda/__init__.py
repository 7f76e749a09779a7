"""Kimi Delta Attention: the delta-rule core with a log-decay per key channel.

    S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (scale * q_t)

Kimi Team, "Kimi Linear: An Expressive, Efficient Attention Architecture"
(https://arxiv.org/abs/2510.26692). The argument order ``(q, k, v, g,
beta)`` is the usual one for this op; shapes, options and returns are those
of ``lin_attn_jax.ops.delta_rule.chunk_delta_rule`` with ``g: [B, T, HV, K]``
(``[B, HV, K]`` for the step). The chunk form keeps every decay factor
``exp`` of a sum of gates (<= 1), so strong per-channel gates underflow to 0
instead of overflowing.
"""

from lin_attn_jax.ops.kda.naive import naive_recurrent_kda
from lin_attn_jax.ops.kda.parallel import parallel_kda
from lin_attn_jax.ops.kda.chunk import chunk_kda
from lin_attn_jax.ops.kda.recurrent import recurrent_kda
from lin_attn_jax.ops.kda.step import kda_step

__all__ = [
    "chunk_kda",
    "kda_step",
    "naive_recurrent_kda",
    "parallel_kda",
    "recurrent_kda",
]
