"""Gated DeltaNet-2 on the delta-rule core: vector erase and write gates.

    S_t = (I - k_t (b_t * k_t)^T) diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T
    o_t = S_t^T (scale * q_t)

``g`` a log-decay per key channel (as KDA), ``b [K]`` the erase gate and
``w [V]`` the write gate. The chunk form is the core's WY form with the
erase key ``b * k`` as the row of its triangular system and ``w * v`` as the
value (README.md).
"""

from lin_attn_jax.ops.gdn2.chunk import chunk_gdn2
from lin_attn_jax.ops.gdn2.naive import naive_recurrent_gdn2
from lin_attn_jax.ops.gdn2.parallel import parallel_gdn2
from lin_attn_jax.ops.gdn2.recurrent import recurrent_gdn2
from lin_attn_jax.ops.gdn2.step import gdn2_step

__all__ = [
    "chunk_gdn2",
    "gdn2_step",
    "naive_recurrent_gdn2",
    "parallel_gdn2",
    "recurrent_gdn2",
]
