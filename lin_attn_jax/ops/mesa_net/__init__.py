"""MesaNet (von Oswald et al. 2025, https://arxiv.org/abs/2506.05233):
``o_t = H^kv_t^T (H^kk_t + diag(lamb))^{-1} q_t`` with two gated-linear
states and a conjugate-gradient solve (README.md)."""

from lin_attn_jax.ops.mesa_net.chunk import chunk_mesa_net
from lin_attn_jax.ops.mesa_net.inputs import (pack_mesa_net_state,
                                              unpack_mesa_net_state)
from lin_attn_jax.ops.mesa_net.naive import naive_recurrent_mesa_net
from lin_attn_jax.ops.mesa_net.parallel import parallel_mesa_net
from lin_attn_jax.ops.mesa_net.recurrent import recurrent_mesa_net
from lin_attn_jax.ops.mesa_net.step import mesa_net_step

__all__ = [
    "chunk_mesa_net",
    "mesa_net_step",
    "naive_recurrent_mesa_net",
    "pack_mesa_net_state",
    "parallel_mesa_net",
    "recurrent_mesa_net",
    "unpack_mesa_net_state",
]
