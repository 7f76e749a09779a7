"""Sparse Transformer attention (strided and fixed factorised patterns)."""

from lin_attn_jax.ops.sparse_attn.naive import sparse_attn_reference
from lin_attn_jax.ops.sparse_attn.parallel import parallel_sparse_attn
from lin_attn_jax.ops.sparse_attn.patterns import sparse_attn_mask

__all__ = [
    "parallel_sparse_attn",
    "sparse_attn_mask",
    "sparse_attn_reference",
]
