"""Flax NNX token mixers, one per variant, and the ``MIXERS`` registry.

Every mixer is built as ``cls(d_model, n_heads, *, rngs, dtype=...,
param_dtype=..., **options)`` and called as ``mixer(x, segment_ids=None,
mode="chunk", cache=None)``; see ``layers/base.py`` for the contract.
"""

from lin_attn_jax.layers.base import MODES, Context, Mixer

from lin_attn_jax.layers.gla import GLA
from lin_attn_jax.layers.linformer import Linformer
from lin_attn_jax.layers.softmax import (SlidingWindowAttention,
                                         SoftmaxAttention, SparseAttention)

MIXERS: dict[str, type[Mixer]] = {
    "gla": GLA,
    "softmax_attn": SoftmaxAttention,
    "sliding_window_attn": SlidingWindowAttention,
    "sparse_attn": SparseAttention,
    "linformer": Linformer,
}

__all__ = ["GLA", "MIXERS", "MODES", "Context", "Linformer", "Mixer",
           "SlidingWindowAttention", "SoftmaxAttention", "SparseAttention"]
