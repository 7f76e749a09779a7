"""Decoder language models built from the mixers in ``lin_attn_jax.layers``."""

from lin_attn_jax.models.lm import LM, Block, LMConfig, Sampling, SwiGLU

__all__ = ["Block", "LM", "LMConfig", "Sampling", "SwiGLU"]
