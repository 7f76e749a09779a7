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

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.segments import document_index, reset_flags
from lin_attn_jax.ops.conv.causal_conv1d import (conv_step, initial_window,
                                                 shifted_sum_conv,
                                                 toeplitz_conv)
from lin_attn_jax.ops.conv.inputs import check_weight
from lin_attn_jax.ops.diagonal_ssm.inputs import check_vector

_F32 = jnp.float32


def _check_C(C, channels, *, direct):
  """``C: [D, N]``; the direct forms also need ``N <= MAX_WIDTH``."""
  if direct:
    return check_weight(C, channels, name="C", layout="[D, N]")
  checks.check_rank("C", C, 2, "[D, N]")
  checks.check_float("C", C)
  if checks.shape_of(C)[0] != channels or checks.shape_of(C)[1] < 1:
    raise ValueError(f"C must have shape [D, N] with D = {channels} and "
                     f"N >= 1, got {checks.shape_of(C)}")
  return checks.shape_of(C)[1]


def _validate(u, C, D, initial_state, segment_ids, *, direct=True):
  checks.check_rank("u", u, 3, "[B, T, D]")
  checks.check_float("u", u)
  batch, length, channels = checks.shape_of(u)
  n_state = _check_C(C, channels, direct=direct)
  check_vector("D", D, channels)
  checks.check_state("initial_state", initial_state,
                     (batch, n_state - 1, channels), "[B, N - 1, D]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, channels, n_state


def _skip(y, u, D):
  return y if D is None else y + jnp.asarray(D, _F32) * jnp.asarray(u, _F32)


def _taps_oldest_first(C):
  """``C[:, l]`` multiplies ``u_{t-l}``; ``causal_conv1d`` wants the oldest
  tap first."""
  return jnp.flip(jnp.asarray(C, _F32), axis=1)


def naive_recurrent_shift_ssm(u, C, *, D=None, initial_state=None,
                              output_final_state=False, segment_ids=None):
  """Reference: the shift register ``x_t = [u_t, x_{t-1}[:-1]]``."""
  batch, length, channels, n_state = _validate(u, C, D, initial_state,
                                               segment_ids, direct=False)
  window0 = initial_window(initial_state, batch, n_state, channels)
  C = jnp.asarray(C, _F32)
  # The register x_{t-1}, newest first: [B, N, D] with x[:, 0] = u_{t-1}; its
  # oldest entry is not part of the state (it is shifted out before a read).
  register = jnp.concatenate(
      [jnp.flip(window0, axis=1),
       jnp.zeros((batch, 1, channels), _F32)], axis=1)
  reset = reset_flags(segment_ids, batch, length)

  def step(register, inputs):
    u_t, reset_t = inputs
    register = jnp.where(reset_t[:, None, None], 0.0, register)
    register = jnp.concatenate([u_t[:, None], register[:, :-1]], axis=1)
    return register, jnp.sum(C.T * register, axis=1)            # [B, D]

  register, y = jax.lax.scan(
      step, register, (jnp.moveaxis(jnp.asarray(u, _F32), 1, 0), reset.T))
  y = _skip(jnp.moveaxis(y, 0, 1), u, D)
  final = jnp.flip(register[:, :-1], axis=1) if output_final_state else None
  return y.astype(u.dtype), final


def parallel_shift_ssm(u, C, *, D=None, initial_state=None,
                       output_final_state=False, segment_ids=None):
  """``parallel_causal_conv1d`` with the taps of ``C``. Shapes as below."""
  batch, length, channels, n_state = _validate(u, C, D, initial_state,
                                               segment_ids)
  window0 = initial_window(initial_state, batch, n_state, channels)
  y, final = shifted_sum_conv(jnp.asarray(u, _F32), _taps_oldest_first(C),
                              window0,
                              document_index(segment_ids, batch, length),
                              output_final_state)
  return _skip(y, u, D).astype(u.dtype), final


def chunk_shift_ssm(u, C, *, D=None, initial_state=None,
                    output_final_state=False, segment_ids=None, chunk_size=64):
  """H3's shift SSM ``y_t = sum_{l < N} C[:, l] u_{t-l} + D u_t``, chunkwise.

  Per chunk of ``L >= N - 1`` tokens and channel, a ``[L, L]`` Toeplitz
  matrix of the taps times the chunk plus one times the chunk before
  (``causal_conv1d.toeplitz_conv``): matmuls, whatever ``N``. With
  ``segment_ids``, the parallel form instead (its masked sum of the taps,
  ``causal_conv1d.shifted_sum_conv``): masked per document, the Toeplitz
  products would hold a ``[B, T / L, D, L, L]`` product (in an H3 LM with
  d_model 256, 4 layers, batch 8 x 256 on CPU, the train step took 3.4 s
  with it against 1.6 s).

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
  batch, _, channels, n_state = _validate(u, C, D, initial_state,
                                          segment_ids)
  checks.check_chunk_size(chunk_size)
  if segment_ids is not None:
    return parallel_shift_ssm(u, C, D=D, initial_state=initial_state,
                              output_final_state=output_final_state,
                              segment_ids=segment_ids)
  window0 = initial_window(initial_state, batch, n_state, channels)
  y, final = toeplitz_conv(jnp.asarray(u, _F32), _taps_oldest_first(C),
                           window0, chunk_size, output_final_state)
  return _skip(y, u, D).astype(u.dtype), final


def shift_ssm_step(u, C, state=None, *, D=None, reset=None):
  """One decoding step: ``u: [B, D]``, state ``[B, N - 1, D]`` float32.

  Returns ``(y [B, D] in u's dtype, new state)``.
  """
  checks.check_rank("u", u, 2, "[B, D]")
  checks.check_float("u", u)
  batch, channels = checks.shape_of(u)
  n_state = _check_C(C, channels, direct=True)
  check_vector("D", D, channels)
  checks.check_state("state", state, (batch, n_state - 1, channels),
                     "[B, N - 1, D]")
  checks.check_reset(reset, batch)
  y, window = conv_step(jnp.asarray(u, _F32), _taps_oldest_first(C),
                        initial_window(state, batch, n_state, channels), reset)
  return _skip(y, u, D).astype(u.dtype), window


def recurrent_shift_ssm(u, C, *, D=None, initial_state=None,
                        output_final_state=False, segment_ids=None):
  """``shift_ssm_step`` scanned over time. Shapes as in the chunk form."""
  batch, length, channels, n_state = _validate(u, C, D, initial_state,
                                               segment_ids)
  window0 = initial_window(initial_state, batch, n_state, channels)
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  C = jnp.asarray(C, _F32)
  D = None if D is None else jnp.asarray(D, _F32)

  def step(window, inputs):
    u_t, reset_t = inputs
    y_t, window = shift_ssm_step(u_t, C, window, D=D, reset=reset_t)
    return window, y_t

  window, y = jax.lax.scan(
      step, window0,
      (jnp.moveaxis(u, 1, 0), reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(y, 0, 1), (window if output_final_state else None)
