"""RetNet multi-scale retention (Sun et al. 2023,
https://arxiv.org/abs/2307.08621): simple GLA with the fixed per-head decay
``gamma_h = 1 - 2 ** (-5 - h)``, i.e. ``g_gamma[h] = log(1 - 2 ** (-5 - h))``.
The group norm and gating of the RetNet layer live in the layer, not here.
"""

from lin_attn_jax.ops.retention.inputs import retention_log_decay
from lin_attn_jax.ops.retention.naive import naive_recurrent_retention
from lin_attn_jax.ops.retention.parallel import parallel_retention
from lin_attn_jax.ops.retention.chunk import chunk_retention
from lin_attn_jax.ops.retention.recurrent import recurrent_retention
from lin_attn_jax.ops.retention.step import retention_step

__all__ = [
    "chunk_retention",
    "naive_recurrent_retention",
    "parallel_retention",
    "recurrent_retention",
    "retention_log_decay",
    "retention_step",
]
