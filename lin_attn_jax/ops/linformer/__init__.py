"""Linformer: softmax attention over keys and values projected along T.

Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity"
(https://arxiv.org/abs/2006.04768). With ``E, F: [P, T]``:

    K' = E K  [P, K],   V' = F V  [P, V],   o_i = softmax(scale * q_i K'^T) V'

Cost ``O(T P)`` instead of ``O(T^2)``. Every projected key ``K'_p = sum_t
E_pt k_t`` mixes all ``T`` positions, the future ones included, so no mask on
the ``[T, P]`` scores can make it causal, and decoding one token at a time
would need the whole sequence in advance: there is no causal form and no KV
cache. Both requests raise ``ValueError``. ``linformer_attn`` (``naive.py``)
is the op's one form; ``linformer_attn_step`` (``step.py``) raises.
"""

from lin_attn_jax.ops.linformer.naive import linformer_attn
from lin_attn_jax.ops.linformer.step import linformer_attn_step

__all__ = ["linformer_attn", "linformer_attn_step"]
