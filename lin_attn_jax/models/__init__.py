"""Decoder language models and bidirectional encoders built from the
mixers in ``lin_attn_jax.layers``."""

from lin_attn_jax.models.encoder import (Classifier, ClassifierConfig,
                                         Encoder, EncoderConfig, MaskedLM,
                                         MLMConfig, ViT, ViTConfig)
from lin_attn_jax.models.lm import LM, Block, LMConfig, Sampling, SwiGLU

__all__ = ["Block", "Classifier", "ClassifierConfig", "Encoder",
           "EncoderConfig", "LM", "LMConfig", "MLMConfig", "MaskedLM",
           "Sampling", "SwiGLU", "ViT", "ViTConfig"]
