"""Mamba-2's state-space dual (SSD): a scalar-decay variant of the GLA core.

Mamba-2's SSD is gated linear attention with a scalar decay per head
(Dao & Gu 2024, https://arxiv.org/abs/2405.21060, section 6):

    q = C   k = B   v = x * dt   g = dt * A   scale = 1
    (B and C broadcast from groups to heads; state [B, H, N, P] = [B, H, K, V])
    y = o + D * x

so the parallel and chunk forms are the GLA core's own; the chunk form's
XLA path is Mamba-2's block decomposition (``block_decomposition.py``).
"""

from lin_attn_jax.ops.ssd.naive import naive_recurrent_ssd
from lin_attn_jax.ops.ssd.parallel import parallel_ssd
from lin_attn_jax.ops.ssd.chunk import chunk_ssd
from lin_attn_jax.ops.ssd.recurrent import recurrent_ssd
from lin_attn_jax.ops.ssd.step import ssd_step

__all__ = [
    "chunk_ssd",
    "naive_recurrent_ssd",
    "parallel_ssd",
    "recurrent_ssd",
    "ssd_step",
]
