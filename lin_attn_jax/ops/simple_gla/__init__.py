"""Simple GLA: a scalar log-decay per head and token (data-dependent ``g``)
or per head (constant ``g_gamma``). ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``,
``o_t = S_t^T (scale q_t)``. Lightning attention and Mamba-2's SSD are
instances (https://arxiv.org/abs/2312.06635, https://arxiv.org/abs/2405.21060).
"""

from lin_attn_jax.ops.simple_gla.inputs import scalar_decay
from lin_attn_jax.ops.simple_gla.naive import naive_recurrent_simple_gla
from lin_attn_jax.ops.simple_gla.parallel import parallel_simple_gla
from lin_attn_jax.ops.simple_gla.chunk import chunk_simple_gla
from lin_attn_jax.ops.simple_gla.recurrent import recurrent_simple_gla
from lin_attn_jax.ops.simple_gla.step import simple_gla_step

__all__ = [
    "chunk_simple_gla",
    "naive_recurrent_simple_gla",
    "parallel_simple_gla",
    "recurrent_simple_gla",
    "scalar_decay",
    "simple_gla_step",
]
