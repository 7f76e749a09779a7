"""MoBA, mixture of block attention (Lu et al., 2025, arXiv:2502.13189).

Each query attends, with one softmax, to its own block of keys (causally)
and to the ``top_k - 1`` earlier blocks whose mean key scores highest
against it; see ``parallel.py`` for the definition and README.md for the
choices and costs of every form.
"""

from lin_attn_jax.ops.moba.chunk import chunk_moba
from lin_attn_jax.ops.moba.parallel import parallel_moba

__all__ = ["chunk_moba", "parallel_moba"]
