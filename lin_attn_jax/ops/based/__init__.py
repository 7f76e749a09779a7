"""Based's linear attention (Arora et al. 2024,
https://arxiv.org/abs/2402.18668): normalized linear attention with the
second-order Taylor feature map, ``phi(q) . phi(k) = 1 + s q.k + (s q.k)^2 / 2``
with ``s = scale``.

q and k have a small feature dimension ``K`` (16 in the paper); the state is
``[B, H, 1 + K + K^2, V + 1]`` (the last value column is the normalizer).
The sliding-window softmax half of a Based block lives in the layer.
"""

from lin_attn_jax.ops.based.inputs import based_features
from lin_attn_jax.ops.based.naive import naive_recurrent_based
from lin_attn_jax.ops.based.parallel import parallel_based
from lin_attn_jax.ops.based.chunk import chunk_based
from lin_attn_jax.ops.based.recurrent import recurrent_based
from lin_attn_jax.ops.based.step import based_step

__all__ = [
    "based_features",
    "based_step",
    "chunk_based",
    "naive_recurrent_based",
    "parallel_based",
    "recurrent_based",
]
