"""The solve ``x = (H^kk + diag(lamb))^{-1} q``: the reference's conjugate
gradient, with an implicit gradient.

The forward pass is flash-linear-attention's CG (``ops/mesa_net``,
``naive_mesa_net_CG`` and the chunk kernel): ``x_0 = 0``, ``r_0 = p_0 =
q``, then ``steps`` iterations of

    alpha = (r . r) / (p . A p + 1e-5)
    x <- x + alpha p,   r' = r - alpha A p
    p <- r' + (r' . r') / (r . r + 1e-5) p

with every system (token, head, batch row) on its own; ``A`` is given as a
function ``matvec``, so the forms apply it chunkwise, quadratically or to
one dense ``[K, K]`` matrix. A fixed number of steps, plain matmuls (no
LAPACK), a ``lax.fori_loop``.

The gradient is not backpropagated through the iterations: as in the
reference's backward pass, ``x`` is taken as the exact solution and the
system is differentiated implicitly (``jax.lax.custom_linear_solve``, ``A``
symmetric): the cotangent ``dx`` gives ``dq = A^{-1} dx``, solved by the
same CG, and ``A``'s inputs get the cotangent ``-dq x^T`` through
``matvec``'s own derivative (for ``A p = H^kk^T p + lamb * p``:
``dH^kk = -x dq^T``, ``dlamb = -sum dq * x``). It equals the gradient of
the exact solve, and the gradient through the iterations once they have
converged.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# The reference's guard in both CG denominators.
CG_EPS = 1e-5


def _dot(a, b):
  return jnp.sum(a * b, axis=-1)


def conjugate_gradient(matvec, b, steps, x0=None):
  """``steps`` CG iterations for ``matvec(x) = b`` from ``x0`` (0 if None).

  b: ``[..., K]`` float32, one system per leading index; ``matvec`` maps
  such an array to one of the same shape; x0 like b. Returns ``x`` like
  ``b``. Differentiable as written (through every iteration).
  """
  def iteration(_, carry):
    x, r, p, delta = carry
    ap = matvec(p)
    alpha = delta / (_dot(p, ap) + CG_EPS)
    x = x + alpha[..., None] * p
    r = r - alpha[..., None] * ap
    delta_new = _dot(r, r)
    p = r + (delta_new / (delta + CG_EPS))[..., None] * p
    return x, r, p, delta_new

  if x0 is None:
    x0, r = jnp.zeros_like(b), b
  else:
    r = b - matvec(x0)
  return jax.lax.fori_loop(0, steps, iteration, (x0, r, r, _dot(r, r)))[0]


def solve(matvec, b, steps, start=None):
  """``conjugate_gradient(matvec, b, steps)`` with the implicit gradient of
  ``x = A^{-1} b`` for a symmetric positive definite ``A`` (module
  docstring); ``matvec`` may close over traced arrays, which get their
  gradients. ``start``: None (``x_0 = 0``) or a function ``b -> x_0`` (not
  differentiated: the gradient is the exact solve's either way)."""
  cg = functools.partial(_solver, steps=steps, start=start)
  return jax.lax.custom_linear_solve(matvec, b, cg, symmetric=True)


def _solver(matvec, b, *, steps, start):
  x0 = None if start is None else start(b)
  return conjugate_gradient(matvec, b, steps, x0)


def diagonal_start(h_kk, lamb):
  """The start of the reference's decoding kernel, ``x_0 = b / (diag(H^kk)
  + lamb + 1e-5)``, for ``h_kk [B, H, K, K]`` and ``lamb [H, K]``."""
  diagonal = jnp.diagonal(h_kk, axis1=-2, axis2=-1) + lamb + CG_EPS
  return lambda b: b / diagonal


def dense_matvec(h_kk, lamb):
  """``p -> H^kk^T p + lamb * p`` for ``h_kk [B, H, K, K]`` and ``lamb [H,
  K]``, on ``p [B, H, K]`` (the reference reads ``H^kk`` by its rows:
  ``(p[..., None] * h_kk).sum(-2)``)."""
  def matvec(p):
    return (jnp.einsum("bhk,bhkl->bhl", p, h_kk,
                       precision=jax.lax.Precision.HIGHEST,
                       preferred_element_type=jnp.float32)
            + lamb * p)
  return matvec
