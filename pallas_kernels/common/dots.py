"""Float32-accumulated matmuls for the kernel bodies.

bfloat16 operands run on the MXU / tensor cores (``mma``) with float32
accumulation. float32 operands run at the highest precision: IEEE float32
on GPU (no TF32, whose 10-bit mantissa would put the kernels' errors near
1e-3, far over the tests' 1e-5) and the multi-pass float32 MXU mode on TPU.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32
NN = (((1,), (0,)), ((), ()))  # a @ b
NT = (((1,), (1,)), ((), ()))  # a @ b.T
TN = (((0,), (0,)), ((), ()))  # a.T @ b


def dot(a, b, dims, *, bf16: bool):
  """``lax.dot_general(a, b, dims)`` accumulated in float32; ``bf16``:
  bfloat16 operands, else float32 operands at the highest precision."""
  if bf16:
    return lax.dot_general(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                           dims, preferred_element_type=_F32)
  return lax.dot_general(a.astype(_F32), b.astype(_F32), dims,
                         precision=lax.Precision.HIGHEST,
                         preferred_element_type=_F32)
