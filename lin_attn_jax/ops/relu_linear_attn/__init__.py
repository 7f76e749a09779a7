"""EfficientViT's ReLU linear attention, non-causal.

Cai et al. 2023, "EfficientViT: Multi-Scale Linear Attention for
High-Resolution Dense Prediction" (https://arxiv.org/abs/2205.14756), its
Eq. 2 over every token of the document, ReLU features and no score scale:

    s_ij = relu(q_i) . relu(k_j),   o_i = sum_j s_ij v_j / (sum_j s_ij + eps)

with ``eps = 1e-15`` as the reference code (``LiteMLA``) adds it. The sums
run over ``i``'s document (``segment_ids``) in both directions. The
multi-scale tokens (depthwise convolutions of q, k and v) are the layer's
(``layers.EfficientViTAttention``). ``relu_linear_attn_reference``
(``naive.py``) is the dense ``[T, T]`` definition; ``chunk_relu_linear_attn``
(``chunk.py``) is ``chunk_linear_attn`` with ``causal=False`` on the ReLU
features and values with one all-ones column (the denominator), so it
splits a sequence over a ``"sequence"`` mesh axis as that form does.
"""

from lin_attn_jax.ops.relu_linear_attn.chunk import chunk_relu_linear_attn
from lin_attn_jax.ops.relu_linear_attn.naive import relu_linear_attn_reference

__all__ = ["chunk_relu_linear_attn", "relu_linear_attn_reference"]
