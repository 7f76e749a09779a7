"""Griffin's Real-Gated Linear Recurrent Unit (RG-LRU), on the linear scan.

De et al. 2024, https://arxiv.org/abs/2402.19427, section 2.4:

    r_t = sigmoid(a_gate_t)                   recurrence gate
    i_t = sigmoid(x_gate_t)                   input gate
    log a_t = -c * r_t * softplus(a_param)    (a = sigmoid(-a_param) ** (c r_t))
    h_t = a_t * h_{t-1} + sqrt(1 - a_t^2) * (i_t * x_t)

``a_gate`` and ``x_gate`` are the gate pre-activations (``W_a x + b_a`` and
``W_x x + b_x``, computed by the layer); ``a_param`` is the per-channel
parameter ``Lambda`` up to sign, as in the reference implementation, and
``c = 8``. ``1 - a^2`` is computed as ``-expm1(2 log a)`` (exact when ``a``
is close to 1), and the square root has its derivative capped at
``MAX_SQRT_GRADIENT`` (it is infinite at 0). The paper's equation (4)
applies the normalisation at every token, and so do these forms by default;
at a document start only ``h_{t-1}`` is dropped. The reference
implementations (Google's ``recurrentgemma`` and HuggingFace's
RecurrentGemma) do not scale the first token of a document: every form
takes ``unscaled`` (``[B, T]`` bool, ``[B]`` for a step), True where
``sqrt(1 - a_t^2)`` is left out.

Letters: b batch, t time, d channel.
"""

from lin_attn_jax.ops.rg_lru.coefficients import rg_lru_coefficients
from lin_attn_jax.ops.rg_lru.coefficients import sqrt_bounded_derivative
from lin_attn_jax.ops.rg_lru.naive import naive_recurrent_rg_lru
from lin_attn_jax.ops.rg_lru.parallel import parallel_rg_lru
from lin_attn_jax.ops.rg_lru.chunk import chunk_rg_lru
from lin_attn_jax.ops.rg_lru.recurrent import recurrent_rg_lru
from lin_attn_jax.ops.rg_lru.step import rg_lru_step

__all__ = [
    "chunk_rg_lru",
    "naive_recurrent_rg_lru",
    "parallel_rg_lru",
    "recurrent_rg_lru",
    "rg_lru_coefficients",
    "rg_lru_step",
    "sqrt_bounded_derivative",
]
