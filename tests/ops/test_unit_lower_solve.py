"""``solve_unit_lower``: the parallel delta-rule forms' long triangular
solve, by blocked forward substitution (matmuls, no LAPACK on CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.ops.delta_rule import chunk
from lin_attn_jax.ops.delta_rule.chunk import (invert_unit_lower,
                                               solve_unit_lower)

BLOCK = 4


def _system(t, seed=0):
  rng = np.random.default_rng(seed)
  # Entries of size 1/sqrt(T): a well-conditioned unit-lower system.
  a = np.tril(rng.standard_normal((2, 3, t, t)) * t ** -0.5, -1)
  rhs = rng.standard_normal((2, 3, t, 5))
  upper = np.triu(rng.standard_normal((2, 3, t, t)))   # must be ignored
  return a, rhs, upper


def _by_inverse(a, rhs, cotangent):
  x = jnp.einsum("...ij,...jr->...ir", invert_unit_lower(a), rhs,
                 precision=jax.lax.Precision.HIGHEST)
  return jnp.sum(x * cotangent)


# Blocks of 4 rows: one partial block, exactly one, several with a padded
# last one.
@pytest.mark.parametrize("t", [3, BLOCK, 3 * BLOCK - 1])
def test_solution_and_gradients(t, monkeypatch):
  monkeypatch.setattr(chunk, "SOLVE_BLOCK", BLOCK)
  a, rhs, upper = _system(t)
  cotangent = np.random.default_rng(1).standard_normal(rhs.shape)
  a32, rhs32, co32 = (jnp.asarray(z, jnp.float32) for z in (a, rhs, cotangent))

  @jax.jit
  def solve_and_grads(a, rhs, cotangent):
    def loss(a, rhs):
      return jnp.sum(solve_unit_lower(a, rhs) * cotangent)
    return solve_unit_lower(a, rhs), jax.grad(loss, (0, 1))(a, rhs)

  x, (da, drhs) = solve_and_grads(a32 + jnp.asarray(upper, jnp.float32),
                                  rhs32, co32)
  expected = np.linalg.solve(np.eye(t) + a, rhs)      # float64, on the host
  np.testing.assert_allclose(x, expected, rtol=0, atol=1e-5)

  # Gradients against autodiff of the explicit inverse (matmuls only).
  ea, erhs = jax.jit(jax.grad(_by_inverse, (0, 1)))(a32, rhs32, co32)
  scale = float(jnp.max(jnp.abs(erhs)))
  np.testing.assert_allclose(da, jnp.tril(ea, -1), rtol=0, atol=1e-5 * scale)
  np.testing.assert_allclose(drhs, erhs, rtol=0, atol=1e-5 * scale)
  assert not np.any(np.triu(np.asarray(da)))


# 5 is padded to 8; 16 and 32 take the elementwise block products up to
# blocks of chunk.SMALL_BLOCK and matmuls above.
@pytest.mark.parametrize("c", [5, 16, 32])
def test_invert_unit_lower_and_its_gradient(c):
  a, _, upper = _system(c, seed=2)
  w = np.random.default_rng(3).standard_normal(a.shape)
  a32 = jnp.asarray(a + upper, jnp.float32)   # upper part must be ignored

  def loss(a):
    return jnp.sum(invert_unit_lower(a) * w)

  inverse, grad = jax.jit(lambda a: (invert_unit_lower(a),
                                     jax.grad(loss)(a)))(a32)
  exact = np.linalg.inv(np.eye(c) + a)                 # float64, on the host
  np.testing.assert_allclose(inverse, exact, rtol=0, atol=2e-6)
  # d/da sum(M * w) with M = (I + a)^{-1}: -M^T w M^T, strictly lower part.
  expected = -np.swapaxes(exact, -1, -2) @ w @ np.swapaxes(exact, -1, -2)
  scale = np.max(np.abs(expected))
  np.testing.assert_allclose(grad, np.tril(expected, -1), rtol=0,
                             atol=2e-6 * scale)
  assert not np.any(np.triu(np.asarray(grad)))
