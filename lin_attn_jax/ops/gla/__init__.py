"""Gated Linear Attention (Yang et al. 2024, https://arxiv.org/abs/2312.06635):
a log-decay per key channel, ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T``,
``o_t = S_t^T (scale q_t)``.

The chunk form stays finite and exact with strong gates (log-decays of -20
per token and far below): it uses sub-chunk-local cumulative sums in which
every exponential is a decay ``<= 1`` (see ``gated_linear/chunk.py``).
"""

from lin_attn_jax.ops.gla.naive import naive_recurrent_gla
from lin_attn_jax.ops.gla.parallel import parallel_gla
from lin_attn_jax.ops.gla.chunk import chunk_gla
from lin_attn_jax.ops.gla.recurrent import recurrent_gla
from lin_attn_jax.ops.gla.step import gla_step

__all__ = [
    "chunk_gla",
    "gla_step",
    "naive_recurrent_gla",
    "parallel_gla",
    "recurrent_gla",
]
