"""H3's diagonal SSM: S4D with a zero-order-hold discretisation.

Gu et al. 2022 (S4D), https://arxiv.org/abs/2206.11893, as used by H3
(https://arxiv.org/abs/2212.14052). Per channel ``d``, ``N`` complex modes:

    dtA  = exp(log_dt) * (A_real + i A_imag)         A_real < 0
    Bbar = (exp(dtA) - 1) / A * B                    (zero-order hold)
    x_t  = exp(dtA) x_{t-1} + Bbar u_t               x: [D, N] complex
    y_t  = 2 Re(C . x_t) + D u_t

The ``N`` complex modes stand for ``2N`` real ones in conjugate pairs, hence
``2 Re``. As a convolution, ``y = K * u + D u`` with ``K_l = 2 Re(sum_n C_n
Bbar_n exp(l dtA_n))``. Powers of ``exp(dtA)`` are always formed as
``exp(l dtA)``, never as repeated products, and ``exp(dtA) - 1`` is an
``expm1`` (exact for small steps).

Complex numbers cross the API as real pairs: ``B, C: [D, N, 2]`` and the
state ``[B, D, N, 2]`` float32 (real, imaginary). Forms: ``naive_recurrent_``,
``parallel_`` (associative scan over ``[B, T, D, N]``), ``chunk_`` (the
training form: Toeplitz matmuls inside chunks, the state between them; no
FFT, which can deadlock XLA's CPU thread pool), ``recurrent_`` and
``_step``.

Letters: b batch, t and l time (lag), d channel, n mode; in the chunk form
m chunk, t and s positions in a chunk.
"""

from lin_attn_jax.ops.s4d.complex_state import complex_expm1
from lin_attn_jax.ops.s4d.complex_state import discretize
from lin_attn_jax.ops.s4d.naive import naive_recurrent_s4d
from lin_attn_jax.ops.s4d.parallel import parallel_s4d
from lin_attn_jax.ops.s4d.chunk import chunk_s4d
from lin_attn_jax.ops.s4d.recurrent import recurrent_s4d
from lin_attn_jax.ops.s4d.step import s4d_step

__all__ = [
    "chunk_s4d",
    "complex_expm1",
    "discretize",
    "naive_recurrent_s4d",
    "parallel_s4d",
    "recurrent_s4d",
    "s4d_step",
]
