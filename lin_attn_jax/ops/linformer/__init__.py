"""Linformer: low-rank projection of K and V along the sequence."""

from lin_attn_jax.ops.linformer.linformer import (linformer_attn,
                                                  linformer_attn_step)

__all__ = ["linformer_attn", "linformer_attn_step"]
