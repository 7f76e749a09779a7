"""The gated-linear-attention core: ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T``.

Every variant on this core (linear attention, simple GLA, RetNet, GLA,
Based, Mamba-2's SSD, ...) is a thin parameterisation of these forms.
"""

from lin_attn_jax.ops.gated_linear.chunk import chunk_gated_linear
from lin_attn_jax.ops.gated_linear.naive import naive_recurrent_gated_linear
from lin_attn_jax.ops.gated_linear.parallel import parallel_gated_linear
from lin_attn_jax.ops.gated_linear.recurrent import recurrent_gated_linear
from lin_attn_jax.ops.gated_linear.step import gated_linear_step

__all__ = [
    "chunk_gated_linear",
    "gated_linear_step",
    "naive_recurrent_gated_linear",
    "parallel_gated_linear",
    "recurrent_gated_linear",
]
