"""Flax NNX token mixers, one per variant, and the ``MIXERS`` registry.

Every mixer is built as ``cls(d_model, n_heads, *, rngs, dtype=...,
param_dtype=..., **options)`` and called as ``mixer(x, segment_ids=None,
mode="chunk", cache=None)``; see ``layers/base.py`` for the contract.
"""

from lin_attn_jax.layers.base import MODES, Context, Mixer

from lin_attn_jax.layers.based import Based
from lin_attn_jax.layers.gla import GLA
from lin_attn_jax.layers.hgrn2 import HGRN2
from lin_attn_jax.layers.linear_attn import LinearAttention
from lin_attn_jax.layers.performer import Performer
from lin_attn_jax.layers.retnet import RetNet

MIXERS: dict[str, type[Mixer]] = {
    "gla": GLA,
    "linear_attn": LinearAttention,
    "performer": Performer,
    "based": Based,
    "retnet": RetNet,
    "hgrn2": HGRN2,
}

__all__ = ["GLA", "MIXERS", "MODES", "Context", "Mixer"]
__all__ += ["Based", "HGRN2", "LinearAttention", "Performer", "RetNet"]
