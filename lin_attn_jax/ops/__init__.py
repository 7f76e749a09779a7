"""Functional ops: every variant in every form.

Forms: ``naive_recurrent_<op>`` (the definition), ``parallel_<op>``,
``chunk_<op>``, ``recurrent_<op>`` and ``<op>_step``. See DESIGN.md for the
conventions (layout ``[B, T, H, K]``, state ``[B, H, K, V]`` float32,
``(o, final_state)`` returns).
"""

# Gated-linear-attention core and its variants.
from lin_attn_jax.ops.based import (based_step, chunk_based,
                                    naive_recurrent_based, parallel_based,
                                    recurrent_based)
from lin_attn_jax.ops.gated_linear import (chunk_gated_linear,
                                           gated_linear_step,
                                           naive_recurrent_gated_linear,
                                           parallel_gated_linear,
                                           recurrent_gated_linear)
from lin_attn_jax.ops.gla import (chunk_gla, gla_step, naive_recurrent_gla,
                                  parallel_gla, recurrent_gla)
from lin_attn_jax.ops.linear_attn import (chunk_linear_attn, linear_attn_step,
                                          naive_recurrent_linear_attn,
                                          parallel_linear_attn,
                                          recurrent_linear_attn)
from lin_attn_jax.ops.retention import (chunk_retention,
                                        naive_recurrent_retention,
                                        parallel_retention,
                                        recurrent_retention, retention_step)
from lin_attn_jax.ops.simple_gla import (chunk_simple_gla,
                                         naive_recurrent_simple_gla,
                                         parallel_simple_gla,
                                         recurrent_simple_gla, simple_gla_step)

# Softmax family: full, sliding window, global tokens, Sparse Transformer,
# Linformer, KV-cache decoding. These return ``o`` only (decoding returns
# ``(o, cache)``).
from lin_attn_jax.ops.linformer import linformer_attn, linformer_attn_step
from lin_attn_jax.ops.softmax_attn import (KVCache, chunk_softmax_attn,
                                           init_kv_cache,
                                           parallel_softmax_attn,
                                           softmax_attn_step)
from lin_attn_jax.ops.sparse_attn import (parallel_sparse_attn,
                                          sparse_attn_mask,
                                          sparse_attn_reference)

# Delta-rule core (DeltaNet, Gated DeltaNet, KDA, RWKV-7) and RWKV-6 (on the
# gated-linear-attention core).
from lin_attn_jax.ops.delta_rule import (chunk_delta_rule, delta_rule_step,
                                         naive_recurrent_delta_rule,
                                         parallel_delta_rule,
                                         recurrent_delta_rule)
from lin_attn_jax.ops.gated_delta_rule import (
    chunk_gated_delta_rule, gated_delta_rule_step,
    naive_recurrent_gated_delta_rule, parallel_gated_delta_rule,
    recurrent_gated_delta_rule)
from lin_attn_jax.ops.kda import (chunk_kda, kda_step, naive_recurrent_kda,
                                  parallel_kda, recurrent_kda)
from lin_attn_jax.ops.rwkv6 import (chunk_rwkv6, naive_recurrent_rwkv6,
                                    parallel_rwkv6, recurrent_rwkv6,
                                    rwkv6_step)
from lin_attn_jax.ops.rwkv7 import (chunk_rwkv7, naive_recurrent_rwkv7,
                                    parallel_rwkv7, recurrent_rwkv7,
                                    rwkv7_step)
