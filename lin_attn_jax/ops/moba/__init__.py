"""MoBA, mixture of block attention (Lu et al., 2025, arXiv:2502.13189).

Each query attends, with one softmax, to its own block of keys (causally)
and to the ``top_k - 1`` earlier blocks whose mean key scores highest
against it; see ``parallel.py`` for the definition and README.md for the
choices and costs of every form.
"""

from lin_attn_jax.ops.moba.cache import (MoBACache, init_moba_cache,
                                         moba_extend)
from lin_attn_jax.ops.moba.chunk import chunk_moba
from lin_attn_jax.ops.moba.context_parallel import context_parallel_moba
from lin_attn_jax.ops.moba.parallel import parallel_moba
from lin_attn_jax.ops.moba.step import moba_step

__all__ = [
    "MoBACache",
    "chunk_moba",
    "context_parallel_moba",
    "init_moba_cache",
    "moba_extend",
    "moba_step",
    "parallel_moba",
]
