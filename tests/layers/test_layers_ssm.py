"""Mixers on the diagonal-SSM core, each inside a 2-layer LM, and their
initialisations."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import H3, MIXERS, RGLRU, Mamba, Mamba2
from lin_attn_jax.testing import lm_checks
from lin_attn_jax.testing import rel_rms

# Small chunks, so that the 24-token test sequences span several chunks, and
# small states, so that compiling stays quick.
MIXER_OPTIONS = {
    "h3": {"d_state": 8, "shift_size": 4, "chunk_size": 8},
    "mamba": {"d_state": 8, "chunk_size": 8},
    "mamba2": {"d_state": 8, "chunk_size": 8},
    "rg_lru": {"chunk_size": 8},
}


# Without segment ids the same modes run on one document: slow only (the
# segment case covers every path and the resets besides).
@pytest.mark.parametrize("use_segments", [
    pytest.param(False, marks=pytest.mark.slow, id="noseg"),
    pytest.param(True, id="seg")])
@pytest.mark.parametrize("name", sorted(MIXER_OPTIONS))
def test_modes_decoding_and_gradients(name, use_segments):
  lm_checks.check_mixer(lm_checks.tiny_lm(name, MIXER_OPTIONS[name]),
                        use_segments=use_segments)


def test_multi_head_h3():
  """Heads of d_h = D / H channels: the d_h^2 entries of a head's kv share
  its S4D (the cache keeps them as rows)."""
  options = dict(MIXER_OPTIONS["h3"], head_dim=None)
  lm_checks.check_mixer(lm_checks.tiny_lm("h3", options), use_segments=True)


def test_mamba_init():
  layer = Mamba(64, 1, rngs=nnx.Rngs(0))
  assert layer.dt_rank == 4 and layer.width == 128
  dt = np.asarray(jax.nn.softplus(layer.dt_bias[...]))
  assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
  # Log-uniform: the logs spread over the whole range, not bunched at an end.
  log_dt = np.log(dt)
  assert abs(np.mean(log_dt) - np.log(1e-2)) < 0.3
  assert np.log(dt.min()) < np.log(2e-3) and np.log(dt.max()) > np.log(5e-2)
  a = -np.exp(np.asarray(layer.A_log[...]))
  np.testing.assert_allclose(a, -np.tile(np.arange(1, 17), (128, 1)),
                             rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(layer.D[...]), 1.0)
  bound = layer.dt_rank ** -0.5
  kernel = np.asarray(layer.dt_proj.kernel[...])
  assert np.abs(kernel).max() <= bound and np.abs(kernel).max() > 0.9 * bound


def test_mamba_dt_floor():
  layer = Mamba(32, 1, rngs=nnx.Rngs(0), dt_min=1e-6, dt_max=1e-5,
                dt_init_floor=1e-4)
  np.testing.assert_allclose(jax.nn.softplus(layer.dt_bias[...]), 1e-4,
                             rtol=1e-4)


def test_mamba2_init():
  layer = Mamba2(64, 32, rngs=nnx.Rngs(0))
  assert layer.head_dim == 4 and layer.d_state == 64
  a = np.exp(np.asarray(layer.A_log[...]))
  assert a.min() >= 1 and a.max() <= 16 and a.max() - a.min() > 8
  dt = np.asarray(jax.nn.softplus(layer.dt_bias[...]))
  assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
  np.testing.assert_array_equal(np.asarray(layer.D[...]), 1.0)


def test_rg_lru_init():
  layer = RGLRU(96, 4, rngs=nnx.Rngs(0))
  assert layer.width == 128
  c = layer.c
  a_c = np.exp(-c * np.asarray(jax.nn.softplus(layer.a_param[...])))
  assert a_c.min() >= 0.9 * (1 - 1e-6) and a_c.max() <= 0.999 * (1 + 1e-6)
  # Uniform: mean and spread of U[0.9, 0.999].
  assert abs(np.mean(a_c) - 0.9495) < 0.01
  assert abs(np.std(a_c) - 0.099 / math.sqrt(12)) < 0.006
  # The paper's form: a = sigmoid(Lambda) with Lambda = -a_param.
  a = jax.nn.sigmoid(-layer.a_param[...])
  np.testing.assert_allclose(a ** c, a_c, rtol=1e-5)


def test_h3_init():
  layer = H3(32, 4, rngs=nnx.Rngs(0), d_state=16)
  log_dt, a_real, a_imag, b, _, _ = layer._s4d_params()
  # One head per channel by default (the reference's head_dim = 1).
  assert layer.head_dim == 1 and layer.n_heads == 32
  assert a_real.shape == (32, 8) and log_dt.shape == (32,)
  np.testing.assert_allclose(a_real, -0.5, rtol=1e-6)
  np.testing.assert_allclose(a_imag[0], np.pi * np.arange(8), rtol=1e-6)
  np.testing.assert_array_equal(b[..., 0], 1.0)
  dt = np.exp(np.asarray(log_dt))
  assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
  assert len(np.unique(dt)) == 32
  multi = H3(32, 4, rngs=nnx.Rngs(0), head_dim=None)
  assert multi.head_dim == 8 and multi.n_heads == 4
  assert multi.init_cache(2, 8)["mixer"]["s4d"].shape == (2, 64, 4, 32, 2)


@pytest.mark.parametrize("build", [
    lambda: Mamba2(32, 3, rngs=nnx.Rngs(0)),
    lambda: Mamba2(32, 4, n_groups=3, rngs=nnx.Rngs(0)),
    lambda: Mamba(32, 2, expand=1.5001, rngs=nnx.Rngs(0)),
    lambda: Mamba(32, 2, dt_min=0.1, dt_max=0.01, rngs=nnx.Rngs(0)),
    lambda: H3(32, 3, head_dim=None, rngs=nnx.Rngs(0)),
    lambda: H3(32, 2, head_dim=5, rngs=nnx.Rngs(0)),
    lambda: H3(32, 2, d_state=7, rngs=nnx.Rngs(0)),
    lambda: H3(32, 2, shift_size=65, rngs=nnx.Rngs(0)),
    lambda: RGLRU(32, 2, lru_width=33, rngs=nnx.Rngs(0)),
    lambda: RGLRU(32, 2, a_min=0.9, a_max=1.0, rngs=nnx.Rngs(0)),
], ids=["mamba2-heads", "mamba2-groups", "mamba-expand", "mamba-dt",
        "h3-heads", "h3-head-dim", "h3-odd-state", "h3-shift", "rg_lru-width", "rg_lru-a"])
def test_bad_hyper_parameters(build):
  with pytest.raises(ValueError):
    build()


# Mamba-2's in the fast suite; the others' (the same dtype handling in
# their own layers) in the slow one.
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=() if n == "mamba2" else pytest.mark.slow)
    for n in sorted(MIXER_OPTIONS)])
def test_bfloat16_close_to_float32(name):
  """bfloat16 parameters and computation against float32 with the same
  (rounded) parameters; outputs in bfloat16, cached states in float32."""
  cls = MIXERS[name]
  low = cls(32, 2, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
            param_dtype=jnp.bfloat16, **MIXER_OPTIONS[name])
  params = nnx.state(low, nnx.Param)
  assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(params))
  full = cls(32, 2, rngs=nnx.Rngs(1), **MIXER_OPTIONS[name])
  nnx.update(full, jax.tree.map(lambda p: p.astype(jnp.float32), params))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 24, 32)),
                  jnp.float32)
  seg = lm_checks.segments(True)

  def run(layer, x, cache):
    graphdef, state = nnx.split(layer)

    def call(state, x, cache):
      return nnx.merge(graphdef, state)(x, segment_ids=seg, cache=cache)

    return jax.jit(call, compiler_options=lm_checks.FAST_COMPILE)(state, x,
                                                                   cache)

  y_low, cache = run(low, x.astype(jnp.bfloat16),
                     low.init_cache(2, 24, jnp.bfloat16))
  y_full, _ = run(full, x, full.init_cache(2, 24))
  assert y_low.dtype == jnp.bfloat16
  assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(cache["mixer"]))
  assert rel_rms(y_low, y_full) < 2e-2
