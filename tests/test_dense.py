"""``layers.modules.Dense``: ``nnx.Linear``'s values and gradients, with the
kernel gradient formed per platform by ``ops.common.products.project``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.ops.common import products

B, T, D, E = 2, 5, 8, 12


def _dense_and_linear():
  dense = modules.dense(D, E, rngs=nnx.Rngs(0))
  linear = nnx.Linear(D, E, use_bias=False, rngs=nnx.Rngs(1))
  linear.kernel[...] = dense.kernel[...]
  return dense, linear


def _loss(layer):
  """``loss(kernel, x)`` of ``layer`` with its kernel replaced."""
  graphdef, state = nnx.split(layer)

  def loss(kernel, x):
    # A bias-free layer's state holds its kernel alone.
    layer = nnx.merge(graphdef, jax.tree.map(lambda _: kernel, state))
    return jnp.sum(jnp.sin(layer(x)))
  return loss


def test_dense_matches_linear():
  dense, linear = _dense_and_linear()
  assert isinstance(dense, modules.Dense)
  kernel = dense.kernel[...]
  for shape in ((B, T, D), (T, D)):   # the project path, and nnx.Linear's
    x = jax.random.normal(jax.random.PRNGKey(0), shape)
    (v1, (dk1, dx1)), (v2, (dk2, dx2)) = (
        jax.value_and_grad(_loss(layer), argnums=(0, 1))(kernel, x)
        for layer in (dense, linear))
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    np.testing.assert_allclose(dk1, dk2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx1, dx2, rtol=1e-5, atol=1e-5)


def test_kernel_gradient_batched_on_cpu_only():
  """Lowered for the CPU the kernel gradient is a batched ``[B, D, E]``
  product; for TPU and CUDA it is the plain product (no such tensor)."""
  dense, _ = _dense_and_linear()
  grad = jax.jit(jax.grad(_loss(dense)))
  args = (dense.kernel[...], jnp.ones((B, T, D)))

  def text(platform):
    return jax.export.export(grad, platforms=[platform])(*args).mlir_module()

  batched = f"tensor<{B}x{D}x{E}xf32>"
  assert batched in text("cpu")
  for platform in ("tpu", "cuda"):
    assert batched not in text(platform)


def test_kernel_gradient_forms_agree():
  """The platforms' two forms of ``x^T g`` (the merged one runs only where
  the lowering is not for the CPU, so it is checked here directly)."""
  kx, kg = jax.random.split(jax.random.PRNGKey(1))
  x, g = jax.random.normal(kx, (B, T, D)), jax.random.normal(kg, (B, T, E))
  expected = np.einsum("btd,bte->de", np.asarray(x, np.float64),
                       np.asarray(g, np.float64))
  for form in (products.kernel_grad_batched, products.kernel_grad_merged):
    np.testing.assert_allclose(form(x, g), expected, rtol=1e-5, atol=1e-5)
