"""Flax NNX token mixers, one per variant, and the ``MIXERS`` registry.

Every mixer is built as ``cls(d_model, n_heads, *, rngs, dtype=...,
param_dtype=..., **options)`` and called as ``mixer(x, segment_ids=None,
mode="chunk", cache=None)``; see ``layers/base.py`` for the contract.
"""

from lin_attn_jax.layers.base import MODES, Context, Mixer

from lin_attn_jax.layers.gla import GLA
from lin_attn_jax.layers.h3 import H3
from lin_attn_jax.layers.linformer import Linformer
from lin_attn_jax.layers.mamba import Mamba
from lin_attn_jax.layers.mamba2 import Mamba2
from lin_attn_jax.layers.rg_lru import RGLRU
from lin_attn_jax.layers.softmax import (SlidingWindowAttention,
                                         SoftmaxAttention, SparseAttention)

MIXERS: dict[str, type[Mixer]] = {
    # Softmax family.
    "softmax_attn": SoftmaxAttention,
    "sliding_window_attn": SlidingWindowAttention,
    "sparse_attn": SparseAttention,
    "linformer": Linformer,
    # Gated-linear-attention core.
    "gla": GLA,
    # Diagonal-SSM core.
    "mamba": Mamba,
    "mamba2": Mamba2,
    "h3": H3,
    "rg_lru": RGLRU,
}

__all__ = ["GLA", "H3", "Linformer", "MIXERS", "MODES", "Context", "Mamba",
           "Mamba2", "Mixer", "RGLRU", "SlidingWindowAttention",
           "SoftmaxAttention", "SparseAttention"]
