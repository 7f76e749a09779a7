"""The log-linear Mamba-2 mixer: fla's parameter shapes and initialisation,
modes, decoding and gradients inside a 2-layer LM, the cache's levels, and
the layer under ``lax.scan`` with its parameters traced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import MIXERS, LogLinearMamba2
from lin_attn_jax.testing import lm_checks, rel_rms

OPTIONS = {"chunk_size": 4, "d_state": 8}


def test_parameters_have_fla_shapes():
  """fla's ``LogLinearMamba2(num_heads=4, head_dim=16, hidden_size=32,
  state_size=8, n_groups=2)``: ``in_proj`` of ``2 E + 2 G N + H + 15 H``
  columns (``z, xBC, dt, dl``), ``L`` ``[H, 15]`` of ones, ``A_log =
  log(1..H)``, the convolution over ``E + 2 G N`` channels."""
  layer = LogLinearMamba2(32, 4, rngs=nnx.Rngs(0), d_state=8, n_groups=2)
  assert MIXERS["log_linear_mamba2"] is LogLinearMamba2
  assert layer.in_proj.kernel.shape == (32, 2 * 64 + 2 * 2 * 8 + 4 + 4 * 15)
  assert layer.in_proj.bias is None and layer.conv.channels == 64 + 32
  np.testing.assert_allclose(layer.A_log[...], np.log([1.0, 2, 3, 4]),
                             rtol=1e-6)
  np.testing.assert_array_equal(layer.L[...], np.ones((4, 15)))
  np.testing.assert_array_equal(layer.D[...], np.ones(4))
  assert layer.out_proj.kernel.shape == (64, 32)


@pytest.mark.parametrize("use_segments", [
    pytest.param(False, marks=pytest.mark.slow, id="noseg"),
    pytest.param(True, id="seg")])
def test_modes_decoding_and_gradients(use_segments):
  lm = lm_checks.tiny_lm("log_linear_mamba2", OPTIONS)
  lm_checks.check_mixer(lm, use_segments=use_segments)


def test_cache_levels_grow_with_log_length():
  layer = nnx.eval_shape(lambda: LogLinearMamba2(32, 2, rngs=nnx.Rngs(0),
                                                 d_state=8, n_levels=6))
  assert [layer.cache_levels(n) for n in (1, 2, 3, 24, 32)] == [
      1, 2, 3, 6, 6]
  assert layer.state_size(24) == 6 * 2 * 8 * 32
  assert layer.state_size(5) == 4 * 2 * 8 * 32
  with pytest.raises(ValueError, match="n_levels = 6"):
    layer.init_cache(1, 33)


@pytest.mark.slow
def test_under_scan_with_traced_parameters():
  """Two calls of the layer in a ``lax.scan`` with its parameters as the
  carry's gradient target: the same as two calls outside."""
  layer = LogLinearMamba2(16, 2, rngs=nnx.Rngs(0), **OPTIONS)
  graphdef, params = nnx.split(layer)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 2, 9, 16)),
                  jnp.float32)

  def loss(params):
    def body(total, x_i):
      y = nnx.merge(graphdef, params)(x_i)
      return total + jnp.sum(y * y), y
    return jax.lax.scan(body, 0.0, x)

  (total, ys), grads = jax.jit(jax.value_and_grad(loss, has_aux=True),
                               compiler_options=lm_checks.FAST_COMPILE)(
                                   params)
  direct = jnp.stack([layer(x[i]) for i in range(2)])
  assert rel_rms(ys, direct) <= 1e-5
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert float(jnp.abs(grads["L"][...]).max()) > 0
