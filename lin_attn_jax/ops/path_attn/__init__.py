"""PaTH attention: softmax attention with accumulated Householder
transformations between queries and keys.

``z_ij = q_i^T (I - beta_i w_i w_i^T) ... (I - beta_{j+1} w_{j+1}
w_{j+1}^T) k_j``, an optional forget-gate bias, then softmax; the
definition with ``[T, T]`` logits, a blockwise form with carried queries
and an online softmax, and a decoding step whose cache holds the keys as
later tokens see them.
"""

from lin_attn_jax.ops.path_attn.cache import (PaTHCache, init_path_cache,
                                              path_attn_extend)
from lin_attn_jax.ops.path_attn.chunk import chunk_path_attn
from lin_attn_jax.ops.path_attn.parallel import parallel_path_attn
from lin_attn_jax.ops.path_attn.step import path_attn_step

__all__ = [
    "PaTHCache",
    "chunk_path_attn",
    "init_path_cache",
    "parallel_path_attn",
    "path_attn_extend",
    "path_attn_step",
]
