"""Linear attention without decay (Katharopoulos et al. 2020,
https://arxiv.org/abs/2006.16236): ``S_t = S_{t-1} + k_t v_t^T``,
``o_t = S_t^T q_t``, optionally divided by ``q_t . sum_{j<=t} k_j``.

Apply a feature map (``lin_attn_jax.feature_maps``) to q and k first.

With ``normalize=True`` the state carries the running key sum as one extra
value column: ``initial_state`` and ``final_state`` are ``[B, H, K, V + 1]``
and ``o = num / (den + eps)`` (``eps = 1e-6``); the features must then be
positive so that the denominator is.
"""

from lin_attn_jax.ops.linear_attn.inputs import NORMALIZER_EPS
from lin_attn_jax.ops.linear_attn.naive import naive_recurrent_linear_attn
from lin_attn_jax.ops.linear_attn.parallel import parallel_linear_attn
from lin_attn_jax.ops.linear_attn.chunk import chunk_linear_attn
from lin_attn_jax.ops.linear_attn.recurrent import recurrent_linear_attn
from lin_attn_jax.ops.linear_attn.step import linear_attn_step

__all__ = [
    "NORMALIZER_EPS",
    "chunk_linear_attn",
    "linear_attn_step",
    "naive_recurrent_linear_attn",
    "parallel_linear_attn",
    "recurrent_linear_attn",
]
