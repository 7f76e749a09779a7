"""H3's shift SSM: a state that shifts in one input per token.

Fu et al. 2023 (H3), https://arxiv.org/abs/2212.14052, section 3.1:

    x_t = S x_{t-1} + e_1 u_t      (S shifts down: x_t = [u_t, ..., u_{t-N+1}])
    y_t = C . x_t + D u_t          per channel, C: [D, N]

so ``y_t = sum_{l < N} C[:, l] u_{t-l} + D u_t``: a causal convolution of
width ``N``. The oldest entry of ``x_t`` is never read again, so the
decoding state is the last ``N - 1`` inputs, oldest first, ``[B, N - 1, D]``,
the state of ``causal_conv1d`` with ``weight = C`` reversed along its taps.

Forms: ``naive_recurrent_`` (the shift register, any ``N``), ``parallel_``
(``causal_conv1d``'s shifted sums, ``N <= 64``), ``chunk_`` (Toeplitz
matmuls per chunk, ``N <= 64``), ``recurrent_`` and ``_step``.
"""

from lin_attn_jax.ops.shift_ssm.naive import naive_recurrent_shift_ssm
from lin_attn_jax.ops.shift_ssm.parallel import parallel_shift_ssm
from lin_attn_jax.ops.shift_ssm.chunk import chunk_shift_ssm
from lin_attn_jax.ops.shift_ssm.recurrent import recurrent_shift_ssm
from lin_attn_jax.ops.shift_ssm.step import shift_ssm_step

__all__ = [
    "chunk_shift_ssm",
    "naive_recurrent_shift_ssm",
    "parallel_shift_ssm",
    "recurrent_shift_ssm",
    "shift_ssm_step",
]
