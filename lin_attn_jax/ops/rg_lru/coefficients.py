"""The RG-LRU's scan coefficients ``a_t`` and ``sqrt(1 - a_t^2) i_t x_t``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32
MAX_SQRT_GRADIENT = 1000.0


@jax.custom_jvp
def sqrt_bounded_derivative(x):
  """``sqrt(x)`` whose derivative is capped at ``MAX_SQRT_GRADIENT``."""
  return jnp.sqrt(x)


@sqrt_bounded_derivative.defjvp
def _sqrt_bounded_derivative_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  y = jnp.sqrt(x)
  return y, dx * (0.5 / jnp.maximum(y, 0.5 / MAX_SQRT_GRADIENT))


def rg_lru_coefficients(x, a_gate, x_gate, a_param, c=8.0, unscaled=None):
  """The linear scan's float32 ``(a, b)``, for any shape ``[..., D]``;
  ``unscaled: [...]`` bool marks tokens whose input is not normalised."""
  log_a = (-c * jax.nn.sigmoid(jnp.asarray(a_gate, _F32))
           * jax.nn.softplus(jnp.asarray(a_param, _F32)))
  multiplier = sqrt_bounded_derivative(-jnp.expm1(2.0 * log_a))
  if unscaled is not None:
    multiplier = jnp.where(jnp.asarray(unscaled)[..., None], 1.0, multiplier)
  gated_x = jax.nn.sigmoid(jnp.asarray(x_gate, _F32)) * jnp.asarray(x, _F32)
  return jnp.exp(log_a), multiplier * gated_x
