"""Nystromformer: softmax attention approximated through ``M`` landmarks.

Xiong et al. 2021, "Nystromformer: A Nystrom-Based Algorithm for
Approximating Self-Attention" (https://arxiv.org/abs/2102.03902). The
landmarks are the segment means of the queries and of the keys (``T / M``
tokens each), and

    Q~ = pool(Q), K~ = pool(K)                    [M, K]
    F = softmax(scale Q K~^T)                     [T, M]
    A = softmax(scale Q~ K~^T)                    [M, M]
    B = softmax(scale Q~ K^T)                     [M, T]
    O = F A^+ (B V)                               [T, V]

with ``A^+`` the Moore-Penrose pseudo-inverse by the paper's iteration
(``iterative_pinv``, matmuls only, no LAPACK). With ``M >= T`` the op is
exact softmax attention (the reference's branch for ``M = T``). Cost
``O(T M)``. The landmarks average the whole row, so the op is not causal
and has no decoding step, and a row holds one document (landmarks would mix
packed documents). ``nystrom_attn`` (``naive.py``) is the op's one form.
"""

from lin_attn_jax.ops.nystrom_attn.naive import nystrom_attn
from lin_attn_jax.ops.nystrom_attn.pinv import iterative_pinv

__all__ = ["iterative_pinv", "nystrom_attn"]
