"""Tracing checks: a function run on tracers, and the primitives it runs.

A value check that turns a tracer into a Python bool fails while tracing,
so these trace (``jax.make_jaxpr``) without compiling. ``primitives`` lists
what a traced program runs, to search it for primitives that become LAPACK
or FFT custom calls on CPU (``CUSTOM_CALL_PRIMITIVES``), which can deadlock
XLA's intra-op thread pool.
"""

from __future__ import annotations

import jax
import jax.extend as jex

# Primitives that lower to LAPACK / pocketfft custom calls on CPU.
CUSTOM_CALL_PRIMITIVES = frozenset({
    "triangular_solve", "lu", "lu_pivots_to_permutation", "qr", "geqrf",
    "geqp3", "householder_product", "cholesky", "cholesky_update", "eig",
    "eigh", "svd", "schur", "hessenberg", "tridiagonal", "tridiagonal_solve",
    "fft",
})


def _sub_jaxprs(value):
  if isinstance(value, jex.core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, jex.core.Jaxpr):
    yield value
  elif isinstance(value, (list, tuple)):
    for item in value:
      yield from _sub_jaxprs(item)


def primitives(jaxpr) -> set[str]:
  """Names of the primitives in ``jaxpr`` and all its sub-jaxprs."""
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for value in eqn.params.values():
      for sub in _sub_jaxprs(value):
        names |= primitives(sub)
  return names


def check_custom_calls(name, closed_jaxpr):
  """Raises ``AssertionError`` if ``closed_jaxpr`` runs a primitive of
  ``CUSTOM_CALL_PRIMITIVES``."""
  found = primitives(closed_jaxpr.jaxpr) & CUSTOM_CALL_PRIMITIVES
  assert not found, f"{name} runs {sorted(found)} (a CPU custom call)"


def traced_grads(loss, differentiable, other):
  """``jax.grad(loss)(differentiable, other)`` inside a ``lax.scan`` body
  inside a ``jax.jit``, traced with abstract or concrete arguments."""
  def scanned(differentiable, other):
    def body(carry, _):
      return carry, jax.grad(loss)(*carry)
    return jax.lax.scan(body, (differentiable, other), None, length=1)[1]
  return jax.make_jaxpr(jax.jit(scanned))(differentiable, other)


def traced_closed_over(fn):
  """``fn()`` (closing over concrete arrays) inside a ``lax.scan`` body."""
  def scanned():
    return jax.lax.scan(lambda c, _: (c, fn()), 0, None, length=1)[1]
  return jax.make_jaxpr(scanned)()
