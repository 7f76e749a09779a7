"""Native sparse attention: compressed, selected and sliding-window branches.

``o = g_cmp o_cmp + g_slc o_slc + g_swa o_swa`` per query and head (Yuan
et al., 2025, arXiv:2502.11089; flash-linear-attention's definition); a
dense reference, a blockwise form, decoding and prefill with a cache, and
a split over a ``sequence`` mesh axis. See README.md.
"""

from lin_attn_jax.ops.nsa.cache import NSACache, init_nsa_cache, nsa_extend
from lin_attn_jax.ops.nsa.chunk import chunk_nsa
from lin_attn_jax.ops.nsa.parallel import parallel_nsa
from lin_attn_jax.ops.nsa.step import nsa_step

__all__ = [
    "NSACache",
    "chunk_nsa",
    "init_nsa_cache",
    "nsa_extend",
    "nsa_step",
    "parallel_nsa",
]
