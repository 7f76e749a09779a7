"""Gated DeltaProduct: ``N`` delta-rule (generalised Householder) steps per
token after a scalar decay per head.

    S_t = (prod_{j=N..1} (I - beta_{t,j} k_{t,j} k_{t,j}^T)) exp(g_t) S_{t-1}
          + (the steps' writes of v_{t,j})
    o_t = S_t^T (scale * q_t)

Siems, Carstensen, Zela, Hutter, Pontil, Grazzi, "DeltaProduct: Improving
State-Tracking in Linear RNNs via Householder Products"
(https://arxiv.org/abs/2502.10297). The argument order is ``(q, k, v, g,
beta)`` with ``k [B, T, N, H, K]``, ``v [B, T, N, HV, V]``, ``beta [B, T,
N, HV]``, ``g [B, T, HV]`` or None; the fast forms run the delta-rule core
on the ``T N`` interleaved sub-steps (README.md).
"""

from lin_attn_jax.ops.gated_delta_product.naive import (
    naive_recurrent_gated_delta_product)
from lin_attn_jax.ops.gated_delta_product.parallel import (
    parallel_gated_delta_product)
from lin_attn_jax.ops.gated_delta_product.chunk import (
    chunk_gated_delta_product)
from lin_attn_jax.ops.gated_delta_product.recurrent import (
    recurrent_gated_delta_product)
from lin_attn_jax.ops.gated_delta_product.step import (
    gated_delta_product_step)

__all__ = [
    "chunk_gated_delta_product",
    "gated_delta_product_step",
    "naive_recurrent_gated_delta_product",
    "parallel_gated_delta_product",
    "recurrent_gated_delta_product",
]
