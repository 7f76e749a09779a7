"""S4D's complex diagonal state kept as real pairs: discretisation,
conversions and the read-out."""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32
C64 = jnp.complex64


def to_complex(pair):
  """``[..., 2]`` (real, imaginary) float -> complex64 ``[...]``."""
  pair = jnp.asarray(pair, _F32)
  return jax.lax.complex(pair[..., 0], pair[..., 1])


def to_pair(z):
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
  b_bar = complex_expm1(dt_a) / jax.lax.complex(a_real, a_imag) * to_complex(B)
  return dt_a, b_bar


def complex_state(state, shape):
  if state is None:
    return jnp.zeros(shape, C64)
  return to_complex(state)


def read_out(x, C, u, D):
  """``2 Re(C . x) + D u`` (float32) for ``x: [..., D, N]``, ``u: [..., D]``."""
  y = 2.0 * jnp.real(jnp.sum(to_complex(C) * x, axis=-1))
  if D is not None:
    y = y + jnp.asarray(D, _F32) * jnp.asarray(u, _F32)
  return y
