"""Flax NNX token mixers, one per variant, and the ``MIXERS`` registry.

Every mixer is built as ``cls(d_model, n_heads, *, rngs, dtype=...,
param_dtype=..., **options)`` and called as ``mixer(x, segment_ids=None,
mode="chunk", cache=None)``; see ``layers/base.py`` for the contract.
"""

from lin_attn_jax.layers.base import MODES, Context, Mixer

from lin_attn_jax.layers.gla import GLA
from lin_attn_jax.layers.h3 import H3
from lin_attn_jax.layers.mamba import Mamba
from lin_attn_jax.layers.mamba2 import Mamba2
from lin_attn_jax.layers.rg_lru import RGLRU

MIXERS: dict[str, type[Mixer]] = {
    "gla": GLA,
    "h3": H3,
    "mamba": Mamba,
    "mamba2": Mamba2,
    "rg_lru": RGLRU,
}

__all__ = ["GLA", "H3", "MIXERS", "MODES", "Context", "Mamba", "Mamba2",
           "Mixer", "RGLRU"]
