"""Batched matmuls whose gradients XLA:CPU runs in its fast library.

XLA:CPU hands a matmul to YNNPACK when it contracts the last axis of its
left operand; the others run several times slower. Autodiff of a plain
einsum makes some of the slow kind (``a^T @ g`` for the gradient of ``b`` in
``a @ b``). ``mm_nt`` and ``mm_nn`` have gradients written with the
transposes made in memory, of the narrow operand (``[C, C]`` or ``[C, V]``
in a chunk form).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def transposed(x):
  """``x`` with its last two axes swapped, materialized."""
  return jax.lax.optimization_barrier(jnp.swapaxes(x, -1, -2))


@jax.custom_vjp
def mm_nt(a, b):
  """``a @ b^T`` over the last two axes: ``[..., I, R], [..., J, R] -> [...,
  I, J]`` float32."""
  return _mm("...ir,...jr->...ij", a, b)


def _mm_nt_fwd(a, b):
  return mm_nt(a, b), (a, b)


def _mm_nt_bwd(res, g):
  a, b = res
  return (_mm("...ij,...jr->...ir", g, b).astype(a.dtype),
          _mm("...ji,...ir->...jr", transposed(g), a).astype(b.dtype))


mm_nt.defvjp(_mm_nt_fwd, _mm_nt_bwd)


@jax.custom_vjp
def mm_nn(a, b):
  """``a @ b`` over the last two axes: ``[..., I, J], [..., J, R] -> [...,
  I, R]`` float32; ``a`` is the narrow operand (transposed for the
  gradient of ``b``)."""
  return _mm("...ij,...jr->...ir", a, b)


def _mm_nn_fwd(a, b):
  return mm_nn(a, b), (a, b)


def _mm_nn_bwd(res, g):
  a, b = res
  return (_mm("...ir,...jr->...ij", g, b).astype(a.dtype),
          _mm("...ji,...ir->...jr", transposed(a), g).astype(b.dtype))


mm_nn.defvjp(_mm_nn_fwd, _mm_nn_bwd)
