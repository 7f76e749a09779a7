"""The chunkwise form of the shift SSM."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.conv.convolutions import initial_window, toeplitz_conv
from lin_attn_jax.ops.shift_ssm.inputs import validate
from lin_attn_jax.ops.shift_ssm.parallel import parallel_shift_ssm
from lin_attn_jax.ops.shift_ssm.taps import skip, taps_oldest_first

_F32 = jnp.float32


def chunk_shift_ssm(u, C, *, D=None, initial_state=None,
                    output_final_state=False, segment_ids=None, chunk_size=64):
  """H3's shift SSM ``y_t = sum_{l < N} C[:, l] u_{t-l} + D u_t``, chunkwise.

  Per chunk of ``L >= N - 1`` tokens and channel, a ``[L, L]`` Toeplitz
  matrix of the taps times the chunk plus one times the chunk before
  (``conv.convolutions.toeplitz_conv``): matmuls, whatever ``N``. With
  ``segment_ids``, the parallel form instead (its masked sum of the taps,
  ``conv.convolutions.shifted_sum_conv``): masked per document, the
  Toeplitz products would hold a ``[B, T / L, D, L, L]`` product (see
  docs/performance.md).

  Args:
    u: ``[B, T, D]``.
    C: ``[D, N]``, ``N <= 64``.
    D: ``[D]`` skip connection, or None.
    initial_state: ``[B, N - 1, D]`` float32, the inputs before ``u_0``
      (oldest first), or None for zeros.
    output_final_state: also return the last ``N - 1`` inputs.
    segment_ids: ``[B, T]`` int; no tap crosses a change of id.
    chunk_size: tokens per chunk (speed and memory only).
  Returns:
    ``(y [B, T, D] in u's dtype, final_state [B, N - 1, D] float32 or
    None)``.

  Example:
    >>> u = jnp.ones((2, 100, 8)); C = jnp.ones((8, 4))
    >>> y, s = chunk_shift_ssm(u, C, output_final_state=True)
    >>> y.shape, s.shape
    ((2, 100, 8), (2, 3, 8))
  """
  batch, _, channels, n_state = validate(u, C, D, initial_state,
                                         segment_ids)
  checks.check_chunk_size(chunk_size)
  if segment_ids is not None:
    return parallel_shift_ssm(u, C, D=D, initial_state=initial_state,
                              output_final_state=output_final_state,
                              segment_ids=segment_ids)
  window0 = initial_window(initial_state, batch, n_state, channels)
  y, final = toeplitz_conv(jnp.asarray(u, _F32), taps_oldest_first(C),
                           window0, chunk_size, output_final_state)
  return skip(y, u, D).astype(u.dtype), final
