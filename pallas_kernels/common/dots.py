"""Float32-accumulated matmuls for the kernel bodies.

- bfloat16 operands run on the MXU / tensor cores (``mma``) with float32
  accumulation.
- float32 operands on TPU run at the highest precision (the MXU's multi-pass
  float32 mode).
- float32 operands of the delta-rule kernels on GPU run as three TF32
  products on the tensor cores ("3xTF32"): ``a b ~ a_hi b_hi + a_hi b_lo + a_lo b_hi`` with ``a_hi`` the
  operand truncated to TF32's 10-bit mantissa and ``a_lo = a - a_hi``. The
  dropped ``a_lo b_lo`` and the rounding of the low parts are ``~2^-21`` of
  each product, so the kernels keep float32 accuracy (the kernel tests'
  ``1e-5``, checked in interpret mode, where the same split runs on the
  CPU). Plain TF32 (mode ``"tf32"``: one product of the truncated
  operands, ``~1e-3``) would not; the delta rule's WY inverse uses it for
  bfloat16 inputs, whose result is rounded to bfloat16. IEEE float32
  (``Precision.HIGHEST`` in Triton, mode ``"f32"``) runs on the CUDA cores
  without ``mma``; the gated-linear kernels use it on GPU, where 3xTF32's
  extra operands make ptxas spill on sm_80.
- float32 operands split into bfloat16 parts on TPU (modes ``"bf16x3"``
  and ``"bf16x6"``): ``x = x_1 + x_2 (+ x_3)``, each part the bfloat16
  rounding of what the parts before it leave, and the products of the
  parts whose ranks sum to at most 3 (``"bf16x3"``: 3 products, about
  ``2^-16`` of each product) or 4 (``"bf16x6"``: 6 products, float32
  accuracy). It is what the MXU's multi-pass float32 mode computes, written
  out so that the parts are formed once per operand; the delta rule's TPU
  WY inverse uses them (``Precision.HIGHEST`` kept its parts in vector
  registers and spilled).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32
NN = (((1,), (0,)), ((), ()))  # a @ b
NT = (((1,), (1,)), ((), ()))  # a @ b.T
TN = (((0,), (0,)), ((), ()))  # a.T @ b

MODES = ("bf16", "f32", "tf32x3", "tf32", "bf16x3", "bf16x6")


def mode(*, bf16: bool, backend: str) -> str:
  """The matmul mode of a kernel: bfloat16 operands, or float32 ones as
  each backend runs them accurately."""
  if bf16:
    return "bf16"
  return "tf32x3" if backend == "gpu" else "f32"


def _tf32_high(x):
  """``x`` with the 13 low mantissa bits cleared (exact in TF32)."""
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  return lax.bitcast_convert_type(bits & jnp.uint32(0xFFFFE000), _F32)


def bf16_parts(x, n: int):
  """``n`` bfloat16 parts of float32 ``x``, largest first: each the
  rounding of what the parts before it leave."""
  parts = []
  rest = x.astype(_F32)
  for _ in range(n):
    part = rest.astype(jnp.bfloat16)
    parts.append(part)
    rest = rest - part.astype(_F32)
  return parts


def split_dot(a, b, dims, parts: tuple[int, int]):
  """``a . b`` (``dims``) from ``parts = (m, n)`` bfloat16 parts of each
  operand: the products of the parts ``i`` of ``a`` and ``j`` of ``b``
  with ``i + j < max(m, n)``, smallest first, accumulated in float32.
  ``(1, 2)`` treats ``a`` as bfloat16-valued (one part, exact when it is)
  and ``b`` to about ``2^-16``: two products."""
  a_parts, b_parts = bf16_parts(a, parts[0]), bf16_parts(b, parts[1])
  n = max(parts)
  pairs = [(i, j) for i in range(parts[0]) for j in range(parts[1])
           if i + j < n]
  total = None
  for i, j in sorted(pairs, key=lambda p: -sum(p)):
    part = lax.dot_general(a_parts[i], b_parts[j], dims,
                           preferred_element_type=_F32)
    total = part if total is None else total + part
  return total


def dot(a, b, dims, *, mode: str):
  """``lax.dot_general(a, b, dims)`` accumulated in float32, in ``mode``
  (one of ``MODES``)."""
  if mode == "bf16":
    return lax.dot_general(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                           dims, preferred_element_type=_F32)
  a, b = a.astype(_F32), b.astype(_F32)
  if mode in ("bf16x3", "bf16x6"):
    n = 2 if mode == "bf16x3" else 3
    return split_dot(a, b, dims, (n, n))
  if mode == "f32":
    return lax.dot_general(a, b, dims, precision=lax.Precision.HIGHEST,
                           preferred_element_type=_F32)

  def tf32(x, y):
    return lax.dot_general(x, y, dims, precision=lax.Precision.DEFAULT,
                           preferred_element_type=_F32)

  a_hi, b_hi = _tf32_high(a), _tf32_high(b)
  if mode == "tf32":
    return tf32(a_hi, b_hi)
  return tf32(a_hi, b_hi) + (tf32(a_hi, b - b_hi) + tf32(a - a_hi, b_hi))
