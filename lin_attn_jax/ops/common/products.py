"""Batched matmuls whose gradients XLA:CPU runs in its fast library.

XLA:CPU hands a matmul to YNNPACK when it contracts the last axis of its
left operand; the others run several times slower. Autodiff of a plain
einsum makes some of the slow kind (``a^T @ g`` for the gradient of ``b`` in
``a @ b``). ``mm_nt`` and ``mm_nn`` have gradients written with the
transposes made in memory, of the narrow operand (``[C, C]`` or ``[C, V]``
in a chunk form). ``project`` is a layer's ``[B, T, D] @ [D, E]`` with its
kernel gradient formed the same way where lowered for the CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def transposed(x):
  """``x`` with its last two axes swapped, as an operand of its own.

  The barrier keeps XLA from folding the swap back into the product that
  reads it (which would make the slow kind again). It does not keep the
  producers of ``x`` out of the transposing copy: XLA:CPU removes barriers
  before it fuses, so the copy may evaluate them in transposed order.
  """
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


def mm_tn(a, b):
  """``a^T @ b`` over the last two axes: ``[..., J, I], [..., J, R] -> [...,
  I, R]`` float32, with ``a`` (the narrow operand) transposed in memory."""
  return mm_nn(transposed(a), b)


@jax.custom_vjp
def _project_matmul(x, kernel):
  """``x @ kernel``: ``[B, T, D], [D, E] -> [B, T, E]`` float32.

  Autodiff of a plain matmul makes the kernel's gradient ``x^T g``, a
  product over the leading (token) axis of both operands, which XLA:CPU
  runs outside its fast matmul library and feeds through a transposing
  copy fused with the producers of ``x`` and ``g``. Lowered for the CPU it
  is here one batched product of ``x`` transposed in memory (one plain
  copy) by ``g``, summed over the batch (no reshape across the batch and
  length axes, which may be sharded); for any other platform, the plain
  product, which holds no ``[B, D, E]`` intermediate.
  """
  return jnp.einsum("btd,de->bte", x, kernel, preferred_element_type=_F32)


def _project_matmul_fwd(x, kernel):
  return _project_matmul(x, kernel), (x, kernel)


# Tokens per block of the CPU kernel gradient (a longer T is padded to a
# multiple of it with zeros, which add nothing to the product).
KERNEL_GRAD_BLOCK = 512


def kernel_grad_batched(x, g):
  """``x^T g`` over ``[B, T, *]``: a batched product of blocks of ``x``
  transposed in memory, summed over the batch and the blocks (XLA:CPU's
  fast library; holds ``[B, T / L, D, E]``).

  The transposing copy is fused with the producers of ``x``, which it then
  reads in transposed order; within blocks of ``L = min(T,
  KERNEL_GRAD_BLOCK)`` tokens those reads stay in cache, faster than
  transposing all of T at once (see docs/performance.md and
  ``benchmarks/RESULTS_train_step.md``).
  """
  batch, length, d = x.shape
  block = max(1, min(length, KERNEL_GRAD_BLOCK))               # T may be 0
  pad = -length % block
  if pad:
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0)))
    g = jnp.pad(g, ((0, 0), (0, pad), (0, 0)))
  blocks = (length + pad) // block
  x_blocks = x.reshape(batch, blocks, block, d)                  # [B,N,L,D]
  g_blocks = g.reshape(batch, blocks, block, g.shape[-1])        # [B,N,L,E]
  return jnp.sum(jnp.einsum("bnds,bnse->bnde", transposed(x_blocks),
                            g_blocks, preferred_element_type=_F32),
                 axis=(0, 1))


def kernel_grad_merged(x, g):
  """``x^T g`` over ``[B, T, *]`` as one product over both axes."""
  return jnp.einsum("btd,bte->de", x, g, preferred_element_type=_F32)


def _project_matmul_bwd(res, g):
  x, kernel = res
  dx = jnp.einsum("bte,de->btd", g, kernel, preferred_element_type=_F32)
  # The batched form holds a [B, D, E] product; only the CPU, whose fast
  # library it reaches, gains from it. Chosen by the lowering platform.
  dk = jax.lax.platform_dependent(
      x, g, cpu=kernel_grad_batched, default=kernel_grad_merged)
  return dx.astype(x.dtype), dk.astype(kernel.dtype)


_project_matmul.defvjp(_project_matmul_fwd, _project_matmul_bwd)


def project(x, kernel, dtype=None):
  """``x @ kernel`` over the last axis of ``x [B, T, D]`` (``kernel [D,
  E]``), computed in ``dtype`` (x's when None) with float32 accumulation;
  the result in ``dtype``. Forward and gradients are those of
  ``nnx.Linear`` without bias; the kernel's gradient is formed as
  ``_project_matmul`` says."""
  dtype = x.dtype if dtype is None else dtype
  return _project_matmul(x.astype(dtype), kernel.astype(dtype)).astype(dtype)


def project_parts(x, kernel, sections, dtype=None):
  """``jnp.split(project(x, kernel, dtype), sections, axis=-1)``, the same
  values. Lowered for the CPU each part is its own ``project`` with its
  block of the kernel's columns, so that every part is an array of its
  own: a part sliced out of one wide product reaches its consumers (and
  its gradient leaves them) through strided copies, which in Mamba-2's
  training step (parts feeding a convolution and the SSD op) cost more
  than the extra products. Elsewhere it is the one product, split."""
  def apart(x, kernel):
    return [project(x, block, dtype)
            for block in jnp.split(kernel, sections, axis=-1)]

  def joint(x, kernel):
    return jnp.split(project(x, kernel, dtype), sections, axis=-1)

  return jax.lax.platform_dependent(x, kernel, cpu=apart, default=joint)
