"""Log-linear attention (log-linear Mamba-2): gated linear attention with a
Fenwick tree of ``L = O(log T)`` states per head, each level read with its
own weight ``lambda_t^(l)`` (Guo et al. 2025,
https://arxiv.org/abs/2506.04761). The chunk and parallel forms are the
gated-linear core's, on ``L`` block terms (README.md)."""

from lin_attn_jax.ops.log_linear_attn.naive import (
    naive_recurrent_log_linear_attn)
from lin_attn_jax.ops.log_linear_attn.parallel import parallel_log_linear_attn
from lin_attn_jax.ops.log_linear_attn.chunk import chunk_log_linear_attn
from lin_attn_jax.ops.log_linear_attn.recurrent import (
    recurrent_log_linear_attn)
from lin_attn_jax.ops.log_linear_attn.step import log_linear_attn_step

__all__ = [
    "chunk_log_linear_attn",
    "log_linear_attn_step",
    "naive_recurrent_log_linear_attn",
    "parallel_log_linear_attn",
    "recurrent_log_linear_attn",
]
