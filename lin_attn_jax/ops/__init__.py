"""Functional ops of every core (pure JAX)."""

# Softmax family: full, sliding window, global tokens, Sparse Transformer,
# Linformer, KV-cache decoding.
from lin_attn_jax.ops.linformer import linformer_attn, linformer_attn_step
from lin_attn_jax.ops.softmax_attn import (KVCache, chunk_softmax_attn,
                                           init_kv_cache,
                                           parallel_softmax_attn,
                                           softmax_attn_step)
from lin_attn_jax.ops.sparse_attn import (parallel_sparse_attn,
                                          sparse_attn_mask,
                                          sparse_attn_reference)
