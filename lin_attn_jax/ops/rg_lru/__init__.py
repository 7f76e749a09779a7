"""Griffin's RG-LRU on the diagonal-SSM core."""

from lin_attn_jax.ops.rg_lru.rg_lru import (chunk_rg_lru,
                                            naive_recurrent_rg_lru,
                                            parallel_rg_lru, recurrent_rg_lru,
                                            rg_lru_coefficients, rg_lru_step,
                                            sqrt_bounded_derivative)

__all__ = [
    "chunk_rg_lru",
    "naive_recurrent_rg_lru",
    "parallel_rg_lru",
    "recurrent_rg_lru",
    "rg_lru_coefficients",
    "rg_lru_step",
    "sqrt_bounded_derivative",
]
