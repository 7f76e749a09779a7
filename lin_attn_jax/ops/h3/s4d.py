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
``parallel_`` (associative scan over ``[B, T, D, N]``), ``fft_conv_`` (the
training form; no ``segment_ids``: a convolution of the packed sequence
cannot reset), ``recurrent_`` and ``_step``.

Letters: b batch, t and l time (lag), d channel, n mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.inputs import check_vector
from lin_attn_jax.ops.diagonal_ssm.scan import (associative_linear_scan,
                                                keep_flags)
from lin_attn_jax.ops.h3.fft import causal_fft_conv

_F32 = jnp.float32
_C64 = jnp.complex64


def _complex(pair):
  """``[..., 2]`` (real, imaginary) float -> complex64 ``[...]``."""
  pair = jnp.asarray(pair, _F32)
  return jax.lax.complex(pair[..., 0], pair[..., 1])


def _pair(z):
  """complex ``[...]`` -> float32 ``[..., 2]``."""
  return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)


def complex_expm1(z):
  """``exp(z) - 1`` without cancellation for small ``|z|``."""
  x, y = jnp.real(z), jnp.imag(z)
  real = jnp.expm1(x) * jnp.cos(y) - 2.0 * jnp.sin(0.5 * y) ** 2
  return jax.lax.complex(real, jnp.exp(x) * jnp.sin(y))


def discretize(log_dt, A_real, A_imag, B):
  """``(dtA, Bbar)``, complex ``[D, N]``."""
  dt = jnp.exp(jnp.asarray(log_dt, _F32))[:, None]               # [D, 1]
  a_real, a_imag = jnp.asarray(A_real, _F32), jnp.asarray(A_imag, _F32)
  dt_a = jax.lax.complex(dt * a_real, dt * a_imag)
  b_bar = complex_expm1(dt_a) / jax.lax.complex(a_real, a_imag) * _complex(B)
  return dt_a, b_bar


def _check_params(channels, log_dt, A_real, A_imag, B, C, D):
  check_vector("log_dt", log_dt, channels)
  checks.check_rank("A_real", A_real, 2, "[D, N]")
  checks.check_float("A_real", A_real)
  if checks.shape_of(A_real)[0] != channels:
    raise ValueError(f"A_real must have shape [D, N] with D = {channels}, got "
                     f"{checks.shape_of(A_real)}")
  n_modes = checks.shape_of(A_real)[1]
  checks.check_float("A_imag", A_imag)
  checks.check_shape("A_imag", A_imag, (channels, n_modes), "[D, N]")
  for name, x in (("B", B), ("C", C)):
    checks.check_float(name, x)
    checks.check_shape(name, x, (channels, n_modes, 2), "[D, N, 2]")
  check_vector("D", D, channels)
  checks.check_negative("A_real", A_real, "a decaying mode")
  return n_modes


def _validate(u, log_dt, A_real, A_imag, B, C, D, initial_state, segment_ids):
  checks.check_rank("u", u, 3, "[B, T, D]")
  checks.check_float("u", u)
  batch, length, channels = checks.shape_of(u)
  n_modes = _check_params(channels, log_dt, A_real, A_imag, B, C, D)
  checks.check_state("initial_state", initial_state,
                     (batch, channels, n_modes, 2), "[B, D, N, 2]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, channels, n_modes


def _state(state, shape):
  if state is None:
    return jnp.zeros(shape, _C64)
  return _complex(state)


def _read_out(x, C, u, D):
  """``2 Re(C . x) + D u`` (float32) for ``x: [..., D, N]``, ``u: [..., D]``."""
  y = 2.0 * jnp.real(jnp.sum(_complex(C) * x, axis=-1))
  if D is not None:
    y = y + jnp.asarray(D, _F32) * jnp.asarray(u, _F32)
  return y


def naive_recurrent_s4d(u, log_dt, A_real, A_imag, B, C, *, D=None,
                        initial_state=None, output_final_state=False,
                        segment_ids=None):
  """Reference recurrence, complex arithmetic. Shapes as in ``fft_conv_s4d``."""
  batch, length, channels, n_modes = _validate(
      u, log_dt, A_real, A_imag, B, C, D, initial_state, segment_ids)
  dt_a, b_bar = discretize(log_dt, A_real, A_imag, B)
  decay = jnp.exp(dt_a)                                          # [D, N]
  c = _complex(C)
  reset = reset_flags(segment_ids, batch, length)

  def step(x, inputs):
    u_t, reset_t = inputs                                        # [B, D], [B]
    x = jnp.where(reset_t[:, None, None], 0.0, x)
    x = decay * x + b_bar * u_t[..., None]
    return x, 2.0 * jnp.real(jnp.sum(c * x, axis=-1))

  x, y = jax.lax.scan(step, _state(initial_state, (batch, channels, n_modes)),
                      (jnp.moveaxis(jnp.asarray(u, _F32), 1, 0), reset.T))
  y = jnp.moveaxis(y, 0, 1)
  if D is not None:
    y = y + jnp.asarray(D, _F32) * jnp.asarray(u, _F32)
  return y.astype(u.dtype), (_pair(x) if output_final_state else None)


def parallel_s4d(u, log_dt, A_real, A_imag, B, C, *, D=None,
                 initial_state=None, output_final_state=False,
                 segment_ids=None):
  """One associative scan over the ``[B, T, D, N]`` complex states."""
  batch, length, channels, n_modes = _validate(
      u, log_dt, A_real, A_imag, B, C, D, initial_state, segment_ids)
  dt_a, b_bar = discretize(log_dt, A_real, A_imag, B)
  keep = keep_flags(segment_ids, batch, length)[..., None, None]  # [B,T,1,1]
  a = jnp.exp(dt_a) * keep                                       # [B,T,D,N]
  b = b_bar * jnp.asarray(u, _F32)[..., None]                    # [B,T,D,N]
  h0 = None if initial_state is None else _complex(initial_state)
  x = associative_linear_scan(a, b, h0)
  y = _read_out(x, C, u, D)
  return y.astype(u.dtype), (_pair(x[:, -1]) if output_final_state else None)


def fft_conv_s4d(u, log_dt, A_real, A_imag, B, C, *, D=None,
                 initial_state=None, output_final_state=False,
                 segment_ids=None):
  """H3's diagonal (S4D) SSM as an FFT convolution, ``O(T log T)``.

  Args:
    u: ``[B, T, D]``.
    log_dt: ``[D]`` log time step.
    A_real: ``[D, N]``, ``< 0``; A_imag: ``[D, N]``.
    B, C: ``[D, N, 2]`` complex as (real, imaginary).
    D: ``[D]`` skip connection, or None.
    initial_state: ``[B, D, N, 2]`` float32 complex state, or None.
    output_final_state: also return the state after the last token.
    segment_ids: must be None (use ``parallel_s4d`` for packed documents).
  Returns:
    ``(y [B, T, D] in u's dtype, final_state [B, D, N, 2] float32 or
    None)``.

  Example:
    >>> u = jnp.ones((2, 100, 8)); log_dt = jnp.full((8,), -3.0)
    >>> A_real = -0.5 * jnp.ones((8, 4)); A_imag = jnp.ones((8, 4))
    >>> B = C = jnp.ones((8, 4, 2))
    >>> y, s = fft_conv_s4d(u, log_dt, A_real, A_imag, B, C,
    ...                     output_final_state=True)
    >>> y.shape, s.shape
    ((2, 100, 8), (2, 8, 4, 2))
  """
  if segment_ids is not None:
    raise ValueError("segment_ids are not supported by fft_conv_s4d: a "
                     "convolution of the packed sequence cannot reset; use "
                     "parallel_s4d or recurrent_s4d")
  batch, length, channels, n_modes = _validate(
      u, log_dt, A_real, A_imag, B, C, D, initial_state, None)
  dt_a, b_bar = discretize(log_dt, A_real, A_imag, B)
  c = _complex(C)
  lags = jnp.arange(length + 1, dtype=_F32)[:, None, None]
  powers = jnp.exp(lags * dt_a)                                  # [T+1, D, N]
  kernel = 2.0 * jnp.real(jnp.sum(c * b_bar * powers[:length], axis=-1))
  uf = jnp.asarray(u, _F32)
  y = causal_fft_conv(uf, kernel.T)                              # [B, T, D]
  if initial_state is not None:
    x0 = _complex(initial_state)                                 # [B, D, N]
    y = y + 2.0 * jnp.real(jnp.einsum("tdn,bdn->btd", c * powers[1:], x0))
  if D is not None:
    y = y + jnp.asarray(D, _F32) * uf
  final = None
  if output_final_state:
    to_end = jnp.flip(powers[:length], axis=0) * b_bar           # [T, D, N]
    final = jnp.einsum("tdn,btd->bdn", to_end, uf.astype(_C64))
    if initial_state is not None:
      final = final + powers[length] * _complex(initial_state)
    final = _pair(final)
  return y.astype(u.dtype), final


def s4d_step(u, log_dt, A_real, A_imag, B, C, state=None, *, D=None,
             reset=None):
  """One decoding step: ``u: [B, D]``, state ``[B, D, N, 2]`` float32.

  Returns ``(y [B, D] in u's dtype, new state)``.
  """
  checks.check_rank("u", u, 2, "[B, D]")
  checks.check_float("u", u)
  batch, channels = checks.shape_of(u)
  n_modes = _check_params(channels, log_dt, A_real, A_imag, B, C, D)
  checks.check_state("state", state, (batch, channels, n_modes, 2),
                     "[B, D, N, 2]")
  checks.check_reset(reset, batch)
  dt_a, b_bar = discretize(log_dt, A_real, A_imag, B)
  x = _state(state, (batch, channels, n_modes))
  if reset is not None:
    x = jnp.where(jnp.asarray(reset)[:, None, None], 0.0, x)
  x = jnp.exp(dt_a) * x + b_bar * jnp.asarray(u, _F32)[..., None]
  return _read_out(x, C, u, D).astype(u.dtype), _pair(x)


def recurrent_s4d(u, log_dt, A_real, A_imag, B, C, *, D=None,
                  initial_state=None, output_final_state=False,
                  segment_ids=None):
  """``s4d_step`` scanned over time. Shapes as in ``fft_conv_s4d``."""
  batch, length, channels, n_modes = _validate(
      u, log_dt, A_real, A_imag, B, C, D, initial_state, segment_ids)
  state = (jnp.zeros((batch, channels, n_modes, 2), _F32)
           if initial_state is None else jnp.asarray(initial_state, _F32))
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  log_dt, A_real, A_imag, B, C, D = (
      None if p is None else jnp.asarray(p, _F32)
      for p in (log_dt, A_real, A_imag, B, C, D))

  def step(state, inputs):
    u_t, reset_t = inputs
    y_t, state = s4d_step(u_t, log_dt, A_real, A_imag, B, C, state, D=D,
                          reset=reset_t)
    return state, y_t

  state, y = jax.lax.scan(
      step, state,
      (jnp.moveaxis(u, 1, 0), reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(y, 0, 1), (state if output_final_state else None)
