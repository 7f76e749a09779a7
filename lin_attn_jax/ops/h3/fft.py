"""Causal convolution by FFT, ``O(T log T)`` for a kernel as long as ``T``."""

from __future__ import annotations

import jax.numpy as jnp


def fft_length(n: int) -> int:
  """The smallest power of two ``>= n``."""
  return 1 << max(0, (n - 1).bit_length())


def causal_fft_conv(u, kernel):
  """``y_t = sum_{l < K} kernel[:, l] * u_{t - l}`` (zeros before ``u_0``).

  Args:
    u: ``[B, L, D]`` float32.
    kernel: ``[D, K]`` float32, tap ``l`` multiplies the input ``l`` steps
      back.
  Returns:
    ``[B, L, D]`` float32. The transform length covers ``L + K - 1`` so the
    circular convolution never wraps around.
  """
  length = u.shape[1]
  n = fft_length(length + kernel.shape[1] - 1)
  u_f = jnp.fft.rfft(u, n=n, axis=1)                            # [B, F, D]
  k_f = jnp.fft.rfft(kernel, n=n, axis=1).T                     # [F, D]
  return jnp.fft.irfft(u_f * k_f, n=n, axis=1)[:, :length]
