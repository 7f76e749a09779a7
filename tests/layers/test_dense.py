"""``layers.modules.Dense``: ``nnx.Linear``'s values and gradients, with the
kernel gradient formed per platform by ``ops.common.products.project``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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
  """Lowered for the CPU the kernel gradient is a batched ``[B, N, D, E]``
  product (``N`` blocks of tokens, one here); for TPU and CUDA it is the
  plain product (no such tensor)."""
  dense, _ = _dense_and_linear()
  grad = jax.jit(jax.grad(_loss(dense)))
  args = (dense.kernel[...], jnp.ones((B, T, D)))

  def text(platform):
    return jax.export.export(grad, platforms=[platform])(*args).mlir_module()

  batched = f"tensor<{B}x1x{D}x{E}xf32>"
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


@pytest.mark.parametrize("length", [8, 13])
def test_kernel_gradient_in_blocks_of_tokens(monkeypatch, length):
  """The CPU form over several blocks of tokens (blocks of 4), the last one
  padded with zeros when T is not a multiple of the block."""
  monkeypatch.setattr(products, "KERNEL_GRAD_BLOCK", 4)
  kx, kg = jax.random.split(jax.random.PRNGKey(4))
  x = jax.random.normal(kx, (B, length, D))
  g = jax.random.normal(kg, (B, length, E))
  expected = np.einsum("btd,bte->de", np.asarray(x, np.float64),
                       np.asarray(g, np.float64))
  got = jax.jit(products.kernel_grad_batched)(x, g)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_parts_are_the_split_product():
  """``Dense.parts``: the split of the layer's output, values and
  gradients; lowered for the CPU one product per part, elsewhere one
  product split (both compared here, the second through its export)."""
  dense, _ = _dense_and_linear()
  sections = [3, 4, 10]                       # parts of 3, 1, 6 and 2
  x = jax.random.normal(jax.random.PRNGKey(2), (B, T, D))
  weights = jax.random.normal(jax.random.PRNGKey(3), (E,))
  graphdef, state = nnx.split(dense)

  def loss(kernel, x, apart):
    layer = nnx.merge(graphdef, jax.tree.map(lambda _: kernel, state))
    if apart:
      out = jnp.concatenate(layer.parts(x, sections), axis=-1)
    else:
      out = layer(x)
    return jnp.sum(jnp.sin(out) * weights)

  kernel = dense.kernel[...]
  parts = dense.parts(x, sections)
  assert [p.shape[-1] for p in parts] == [3, 1, 6, 2]
  for part, expected in zip(parts, jnp.split(dense(x), sections, axis=-1)):
    np.testing.assert_allclose(part, expected, rtol=1e-6, atol=1e-6)
  got, want = (jax.grad(loss, argnums=(0, 1))(kernel, x, apart)
               for apart in (True, False))
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

  def count_dots(platform):
    f = jax.jit(lambda k, x: nnx.merge(
        graphdef, jax.tree.map(lambda _: k, state)).parts(x, sections))
    text = jax.export.export(f, platforms=[platform])(kernel, x).mlir_module()
    return text.count("stablehlo.dot_general")
  assert count_dots("cpu") == 4
  assert count_dots("tpu") == 1


def test_short_conv_parts_are_the_split_convolution():
  """``ShortConv.parts``: the split of the whole convolution, outputs,
  cached window and gradients, with documents and a carried state; a
  decoding step equals the whole convolution's."""
  from lin_attn_jax.layers.base import Context
  conv = modules.ShortConv(10, 4, rngs=nnx.Rngs(0))
  conv.bias[...] = jax.random.normal(jax.random.PRNGKey(4), (10,))
  x = jax.random.normal(jax.random.PRNGKey(5), (B, 9, 10))
  state = jax.random.normal(jax.random.PRNGKey(6), (B, 3, 10))
  segment_ids = jnp.array([[0] * 4 + [1] * 5, [0] * 9])
  positions = jnp.broadcast_to(jnp.arange(9), (B, 9))
  ctx = Context(mode="chunk", segment_ids=segment_ids, positions=positions,
                cache={}, restart=jnp.array([False, True]))
  sections = [2, 7]

  def run(x, state, apart):
    if apart:
      ys, new = conv.parts(jnp.split(x, sections, axis=-1), ctx, state)
      return jnp.concatenate(ys, axis=-1), new
    return conv(x, ctx, state)

  def loss(x, s, apart):
    y, new = run(x, s, apart)
    return jnp.sum(jnp.sin(y)) + jnp.sum(new ** 2)

  compiled = jax.jit(lambda x, s, apart: (run(x, s, apart), jax.grad(
      loss, argnums=(0, 1))(x, s, apart)), static_argnums=2)
  ((y1, s1), got), ((y2, s2), want) = (compiled(x, state, a)
                                       for a in (True, False))
  np.testing.assert_allclose(y1, y2, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(s1, s2, rtol=1e-6, atol=1e-6)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  step = Context(mode="chunk", segment_ids=None, positions=positions[:, :1],
                 cache={}, restart=None)
  ys, new = conv.parts(jnp.split(x[:, :1], sections, axis=-1), step, state)
  y, expected = conv(x[:, :1], step, state)
  np.testing.assert_allclose(jnp.concatenate(ys, axis=-1), y, rtol=1e-6)
  np.testing.assert_allclose(new, expected, rtol=1e-6)
  with np.testing.assert_raises(ValueError):
    conv.parts([x[..., :3]], ctx, state)


def test_rotary_matches_its_definition():
  """``modules.rotary`` (its table of cosines and sines written once on
  CPU) against the rotation written out in float64: channel ``i`` with
  ``i + K/2`` by ``position * base ** (-2 i / K)``, per batch row's
  positions; and its gradient, a rotation back."""
  b, t, h, k = 2, 7, 3, 8
  x = jax.random.normal(jax.random.PRNGKey(5), (b, t, h, k))
  positions = jnp.array([[0, 1, 2, 3, 4, 5, 6], [9, 10, 0, 1, 2, 3, 40]])
  freq = 10000.0 ** (-np.arange(k // 2) * 2 / k)
  angle = np.asarray(positions, np.float64)[:, :, None, None] * freq
  x1, x2 = np.split(np.asarray(x, np.float64), 2, axis=-1)
  expected = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle),
                             x2 * np.cos(angle) + x1 * np.sin(angle)], -1)
  got = jax.jit(modules.rotary)(x, positions)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  weights = jax.random.normal(jax.random.PRNGKey(6), (b, t, h, k))
  grad = jax.jit(jax.grad(
      lambda x: jnp.sum(modules.rotary(x, positions) * weights)))(x)
  w1, w2 = np.split(np.asarray(weights, np.float64), 2, axis=-1)
  expected_grad = np.concatenate(
      [w1 * np.cos(angle) + w2 * np.sin(angle),
       w2 * np.cos(angle) - w1 * np.sin(angle)], -1)
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-5)


def test_linear_lora_and_per_channel_are_their_equations():
  """``modules.linear``, ``lora`` and ``per_channel`` give ``x W + b``, ``b
  + f(x A) B``, ``x * p`` and ``x + p``, values and gradients."""
  keys = jax.random.split(jax.random.PRNGKey(3), 6)
  x = jax.random.normal(keys[0], (2, 5, 8))
  down = jax.random.normal(keys[1], (8, 3))
  up = jax.random.normal(keys[2], (3, 6))
  bias = jax.random.normal(keys[3], (6,))
  p = jax.random.normal(keys[4], (6,))
  cotangent = jax.random.normal(keys[5], (2, 5, 6))

  def fast(x, down, up, bias, p):
    y = modules.lora(x, down, up, jnp.tanh, bias)
    return (y * modules.per_channel(p)) + modules.per_channel(nnx.Param(p))

  def plain(x, down, up, bias, p):
    y = bias + jnp.tanh(x @ down) @ up
    return y * p + p

  args = (x, down, up, bias, p)
  np.testing.assert_allclose(fast(*args), plain(*args), rtol=1e-5, atol=1e-5)
  grads = jax.grad(lambda *a: jnp.sum(fast(*a) * cotangent),
                   argnums=range(5))(*args)
  expected = jax.grad(lambda *a: jnp.sum(plain(*a) * cotangent),
                      argnums=range(5))(*args)
  for got, want in zip(grads, expected):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(modules.linear(x, nnx.Param(down)), x @ down,
                             rtol=1e-5, atol=1e-5)
