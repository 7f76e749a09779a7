"""Flax NNX token mixers, one per variant, and the ``MIXERS`` registry.

Every mixer is built as ``cls(d_model, n_heads, *, rngs, dtype=...,
param_dtype=..., **options)`` and called as ``mixer(x, segment_ids=None,
mode="chunk", cache=None)``; see ``layers/base.py`` for the contract.
"""

from lin_attn_jax.layers.base import MODES, Context, Mixer

from lin_attn_jax.layers.gla import GLA

MIXERS: dict[str, type[Mixer]] = {
    "gla": GLA,
}

__all__ = ["GLA", "MIXERS", "MODES", "Context", "Mixer"]
