"""Comba on the delta-rule core: a separate erase key, read before the decay.

    S_t = (exp(g_t) I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T
        = a_t S_{t-1} + beta_t k_t (v_t - S_{t-1}^T p_t)^T
    o_t = S_t^T (scale * q_t)

``g`` a scalar log-decay per head (``a_t = exp(g_t)``), ``p`` the erase key
(the state is read along p, written along k): a scalar-plus-low-rank
transition. The chunk form is the core's WY form with ``beta * p`` as the
row of its triangular system, read before the decay (README.md). The output
correction ``q - d p`` of the Comba layer is applied to q before the op.
"""

from lin_attn_jax.ops.comba.chunk import chunk_comba
from lin_attn_jax.ops.comba.naive import naive_recurrent_comba
from lin_attn_jax.ops.comba.parallel import parallel_comba
from lin_attn_jax.ops.comba.recurrent import recurrent_comba
from lin_attn_jax.ops.comba.step import comba_step

__all__ = [
    "chunk_comba",
    "comba_step",
    "naive_recurrent_comba",
    "parallel_comba",
    "recurrent_comba",
]
