"""Functional ops: every variant in every form.

Forms: ``naive_recurrent_<op>`` (the definition), ``parallel_<op>``,
``chunk_<op>``, ``recurrent_<op>`` and ``<op>_step``, each defined in
``lin_attn_jax/ops/<op>/<form>.py``. See docs/design.md for the layout and the
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
from lin_attn_jax.ops.mlstm import (chunk_mlstm, mlstm_step,
                                    naive_recurrent_mlstm, pack_mlstm_state,
                                    parallel_mlstm, recurrent_mlstm,
                                    unpack_mlstm_state)
from lin_attn_jax.ops.performer import chunk_favor_attn, favor_features
from lin_attn_jax.ops.retention import (chunk_retention,
                                        naive_recurrent_retention,
                                        parallel_retention,
                                        recurrent_retention, retention_step)
from lin_attn_jax.ops.simple_gla import (chunk_simple_gla,
                                         naive_recurrent_simple_gla,
                                         parallel_simple_gla,
                                         recurrent_simple_gla, simple_gla_step)

# Softmax family: full, sliding window, global tokens, Sparse Transformer,
# Linformer, the encoder-only mixers (Agent Attention, Nystromformer,
# EfficientViT's ReLU linear attention), native sparse attention, KV-cache
# decoding. These return ``o`` only (decoding returns ``(o, cache)``).
from lin_attn_jax.ops.linformer import linformer_attn, linformer_attn_step
from lin_attn_jax.ops.agent_attn import agent_attn
from lin_attn_jax.ops.nystrom_attn import iterative_pinv, nystrom_attn
from lin_attn_jax.ops.relu_linear_attn import (chunk_relu_linear_attn,
                                               relu_linear_attn_reference)
from lin_attn_jax.ops.nsa import (NSACache, chunk_nsa, init_nsa_cache,
                                  nsa_extend, nsa_step, parallel_nsa)
from lin_attn_jax.ops.moba import (MoBACache, chunk_moba, init_moba_cache,
                                   moba_extend, moba_step, parallel_moba)
from lin_attn_jax.ops.path_attn import (PaTHCache, chunk_path_attn,
                                        init_path_cache, parallel_path_attn,
                                        path_attn_extend, path_attn_step)
from lin_attn_jax.ops.softmax_attn import (KVCache, chunk_softmax_attn,
                                           init_kv_cache,
                                           parallel_softmax_attn,
                                           softmax_attn_extend,
                                           softmax_attn_step)
from lin_attn_jax.ops.sparse_attn import (parallel_sparse_attn,
                                          sparse_attn_mask,
                                          sparse_attn_reference)
from lin_attn_jax.ops.stickbreaking_attn import (chunk_stickbreaking_attn,
                                                 parallel_stickbreaking_attn,
                                                 stickbreaking_attn_extend,
                                                 stickbreaking_attn_step)
from lin_attn_jax.ops.forgetting_attn import (ForgettingCache,
                                              chunk_forgetting_attn,
                                              forgetting_attn_extend,
                                              forgetting_attn_step,
                                              init_forgetting_cache,
                                              parallel_forgetting_attn)

# Diagonal-SSM core and the ops on it (Mamba, Mamba-2 SSD, H3, RG-LRU, HGRN),
# and the short causal convolution.
from lin_attn_jax.ops.conv import (causal_conv1d_step, chunk_causal_conv1d,
                                   naive_recurrent_causal_conv1d,
                                   parallel_causal_conv1d,
                                   recurrent_causal_conv1d)
from lin_attn_jax.ops.diagonal_ssm import (chunk_linear_scan, linear_scan_step,
                                           naive_recurrent_linear_scan,
                                           parallel_linear_scan,
                                           recurrent_linear_scan)
from lin_attn_jax.ops.s4d import (chunk_s4d, naive_recurrent_s4d, parallel_s4d,
                                  recurrent_s4d, s4d_step)
from lin_attn_jax.ops.shift_ssm import (chunk_shift_ssm,
                                        naive_recurrent_shift_ssm,
                                        parallel_shift_ssm,
                                        recurrent_shift_ssm, shift_ssm_step)
from lin_attn_jax.ops.hgrn import (chunk_hgrn, hgrn_step, naive_recurrent_hgrn,
                                   parallel_hgrn, recurrent_hgrn)
from lin_attn_jax.ops.mamba import (chunk_selective_scan,
                                    naive_recurrent_selective_scan,
                                    parallel_selective_scan,
                                    recurrent_selective_scan,
                                    selective_scan_step)
from lin_attn_jax.ops.rg_lru import (chunk_rg_lru, naive_recurrent_rg_lru,
                                     parallel_rg_lru, recurrent_rg_lru,
                                     rg_lru_step)
from lin_attn_jax.ops.ssd import (chunk_ssd, naive_recurrent_ssd, parallel_ssd,
                                  recurrent_ssd, ssd_step)
from lin_attn_jax.ops.mamba3 import (chunk_mamba3, mamba3_step,
                                     naive_recurrent_mamba3, pack_mamba3_state,
                                     parallel_mamba3, recurrent_mamba3,
                                     unpack_mamba3_state)
from lin_attn_jax.ops.mamba3 import (chunk_mamba3_mimo, mamba3_mimo_step,
                                     naive_recurrent_mamba3_mimo,
                                     pack_mamba3_mimo_state,
                                     parallel_mamba3_mimo,
                                     recurrent_mamba3_mimo,
                                     unpack_mamba3_mimo_state)

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
from lin_attn_jax.ops.gdn2 import (chunk_gdn2, gdn2_step, naive_recurrent_gdn2,
                                   parallel_gdn2, recurrent_gdn2)
from lin_attn_jax.ops.gated_delta_product import (
    chunk_gated_delta_product, gated_delta_product_step,
    naive_recurrent_gated_delta_product, parallel_gated_delta_product,
    recurrent_gated_delta_product)
from lin_attn_jax.ops.comba import (chunk_comba, comba_step,
                                    naive_recurrent_comba, parallel_comba,
                                    recurrent_comba)
from lin_attn_jax.ops.log_linear_attn import (
    chunk_log_linear_attn, log_linear_attn_step,
    naive_recurrent_log_linear_attn, parallel_log_linear_attn,
    recurrent_log_linear_attn)

# MesaNet: two gated-linear states and a conjugate-gradient solve.
from lin_attn_jax.ops.mesa_net import (chunk_mesa_net, mesa_net_step,
                                       naive_recurrent_mesa_net,
                                       pack_mesa_net_state, parallel_mesa_net,
                                       recurrent_mesa_net,
                                       unpack_mesa_net_state)

# Context parallelism: the chunk forms above split the sequence by themselves
# under a mesh with a "sequence" axis of size > 1 (jax.set_mesh); these take
# the axis name and mesh explicitly. See docs/context_parallel.md.
from lin_attn_jax.ops.common.context_parallel import sequence_parallel_size
from lin_attn_jax.ops.conv.context_parallel import (
    context_parallel_causal_conv1d, context_parallel_token_shift)
from lin_attn_jax.ops.conv.token_shift import token_shift
from lin_attn_jax.ops.delta_rule.context_parallel import (
    context_parallel_delta_rule)
from lin_attn_jax.ops.forgetting_attn.context_parallel import (
    context_parallel_forgetting_attn)
from lin_attn_jax.ops.diagonal_ssm.context_parallel import (
    context_parallel_linear_scan)
from lin_attn_jax.ops.gated_linear.context_parallel import (
    context_parallel_gated_linear)
from lin_attn_jax.ops.mamba.context_parallel import (
    context_parallel_selective_scan)
from lin_attn_jax.ops.nsa.context_parallel import context_parallel_nsa
from lin_attn_jax.ops.moba.context_parallel import context_parallel_moba
from lin_attn_jax.ops.path_attn.context_parallel import (
    context_parallel_path_attn)
from lin_attn_jax.ops.rwkv7.context_parallel import context_parallel_rwkv7
from lin_attn_jax.ops.softmax_attn.context_parallel import (
    context_parallel_softmax_attn)
from lin_attn_jax.ops.stickbreaking_attn.context_parallel import (
    context_parallel_stickbreaking_attn)
from lin_attn_jax.ops.gdn2.context_parallel import context_parallel_gdn2
from lin_attn_jax.ops.comba.context_parallel import context_parallel_comba
from lin_attn_jax.ops.mesa_net.context_parallel import (
    context_parallel_mesa_net)
