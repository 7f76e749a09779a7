"""Flax NNX token mixers, one per variant, and the ``MIXERS`` registry.

Every mixer is built as ``cls(d_model, n_heads, *, rngs, dtype=...,
param_dtype=..., **options)`` and called as ``mixer(x, segment_ids=None,
mode="chunk", cache=None)``; see ``layers/base.py`` for the contract.
"""

from lin_attn_jax.layers.base import MODES, Context, Mixer

from lin_attn_jax.layers.deltanet import KDA, DeltaNet, GatedDeltaNet
from lin_attn_jax.layers.gla import GLA
from lin_attn_jax.layers.rwkv import RWKV6, RWKV7

MIXERS: dict[str, type[Mixer]] = {
    "gla": GLA,
    "deltanet": DeltaNet,
    "gated_deltanet": GatedDeltaNet,
    "kda": KDA,
    "rwkv6": RWKV6,
    "rwkv7": RWKV7,
}

__all__ = ["GLA", "MIXERS", "MODES", "Context", "Mixer"]
__all__ += ["KDA", "RWKV6", "RWKV7", "DeltaNet", "GatedDeltaNet"]
