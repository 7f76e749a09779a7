"""Mamba-1's selective scan (S6) on the diagonal-SSM core."""

from lin_attn_jax.ops.mamba.chunk import chunk_selective_scan
from lin_attn_jax.ops.mamba.naive import naive_recurrent_selective_scan
from lin_attn_jax.ops.mamba.parallel import parallel_selective_scan
from lin_attn_jax.ops.mamba.recurrent import recurrent_selective_scan
from lin_attn_jax.ops.mamba.step import selective_scan_step

__all__ = [
    "chunk_selective_scan",
    "naive_recurrent_selective_scan",
    "parallel_selective_scan",
    "recurrent_selective_scan",
    "selective_scan_step",
]
