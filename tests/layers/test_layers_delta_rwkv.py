"""Mixers on the delta-rule core and RWKV-6/7, each inside a 2-layer LM."""

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import (KDA, MIXERS, RWKV6, RWKV7, DeltaNet,
                                 GatedDeltaNet)
from lin_attn_jax.ops.common import products, reductions
from lin_attn_jax.testing import lm_checks
from lin_attn_jax.testing import rel_rms

# Small chunks, so that the 24-token test sequences span several chunks.
MIXER_OPTIONS = {
    "deltanet": {"chunk_size": 8},
    # The default init zeroes the output gate (tests/layers/test_recall.py), and
    # the reference init of RWKV-7 the output projection (tested on its own
    # below); the other checks need an output.
    "gated_deltanet": {"chunk_size": 8, "zero_init_gate": False},
    "kda": {"chunk_size": 8},
    "rwkv6": {"chunk_size": 8},
    "rwkv7": {"chunk_size": 8, "zero_init_output": False},
    "gated_deltaproduct": {"chunk_size": 8, "zero_init_gate": False},
}
# RWKV-7's reference init (zero LoRA inputs, keys scaled by 0.05, small
# gates) puts about 1% of the logits on its mixers at these sizes: the LM
# checks redraw these matrices (LeCun normal) so that they can fail.
REDRAWN = {"rwkv7": ("decay_down", "iclr_down", "gate_down", "gate_up",
                     "r_proj", "k_proj", "v_proj", "o_proj")}
D_MODEL, HEADS = 32, 2


def inputs(seed=0, batch=1, length=16, d=D_MODEL):
  return jnp.asarray(np.random.default_rng(seed).normal(
      size=(batch, length, d)), jnp.float32)


def redraw(lm, names, seed=3):
  """Every mixer's parameters (or dense kernels) ``names``, redrawn."""
  rng = np.random.default_rng(seed)
  for block in lm.blocks:
    for name in names:
      param = getattr(block.mixer, name)
      param = getattr(param, "kernel", param)
      param.set_value(jnp.asarray(
          rng.normal(size=param.shape) / np.sqrt(param.shape[0]),
          param.dtype))
  return lm


def jitted(fn, *modules):
  """``fn(*modules, *args)`` as one compiled program of ``args``."""
  graphdef, state = nnx.split(modules)

  def run(state, *args):
    return fn(*nnx.merge(graphdef, state), *args)

  compiled = jax.jit(run, compiler_options=lm_checks.FAST_COMPILE)
  return lambda *args: compiled(state, *args)


# Without segment ids the same modes run on one document: slow only (the
# segment case covers every path and the resets besides).
@pytest.mark.parametrize("use_segments", [
    pytest.param(False, marks=pytest.mark.slow, id="noseg"),
    pytest.param(True, id="seg")])
@pytest.mark.parametrize("name", sorted(MIXER_OPTIONS))
def test_modes_decoding_and_gradients(name, use_segments):
  lm = redraw(lm_checks.tiny_lm(name, MIXER_OPTIONS[name]),
              REDRAWN.get(name, ()))
  lm_checks.check_mixer(lm, use_segments=use_segments)


def test_registered():
  assert {"deltanet": DeltaNet, "gated_deltanet": GatedDeltaNet, "kda": KDA,
          "rwkv6": RWKV6, "rwkv7": RWKV7}.items() <= MIXERS.items()


@pytest.mark.parametrize("name", sorted(MIXER_OPTIONS))
def test_packed_documents_match_separate_runs(name):
  """A document packed after another gives the outputs it gives alone: the
  short convolutions, the token shift and the state all restart."""
  layer = MIXERS[name](D_MODEL, HEADS, rngs=nnx.Rngs(0),
                       **MIXER_OPTIONS[name])
  x = inputs(length=14)
  seg = jnp.asarray([[0] * 5 + [1] * 9], jnp.int32)

  def run(layer, x, seg):
    return (layer(x, segment_ids=seg, mode="recurrent"),
            layer(x[:, 5:], mode="recurrent"), layer(x, mode="recurrent"))

  packed, second, unpacked = jitted(run, layer)(x, seg)
  assert rel_rms(packed[:, 5:], second) < 1e-5
  assert rel_rms(unpacked[:, 5:], second) > 1e-2


def test_deltanet_beta_in_unit_interval_and_neg_eigval_doubles_it():
  x = inputs()
  layer = DeltaNet(D_MODEL, HEADS, rngs=nnx.Rngs(0))
  beta = np.asarray(layer.beta(x))
  assert beta.shape == (1, 16, HEADS)
  assert np.all((beta > 0) & (beta < 1))
  wide = DeltaNet(D_MODEL, HEADS, rngs=nnx.Rngs(0), allow_neg_eigval=True)
  np.testing.assert_allclose(np.asarray(wide.beta(x)), 2 * beta, rtol=1e-6)


def test_gated_deltanet_decay_init_is_mamba2():
  layer = GatedDeltaNet(64, 4, rngs=nnx.Rngs(0))
  a = np.exp(np.asarray(layer.A_log[...]))
  dt = np.log1p(np.exp(np.asarray(layer.dt_bias[...])))
  assert np.all((a >= 1) & (a <= 16)) and np.all((dt >= 1e-3) & (dt <= 0.1))
  g = np.asarray(jitted(GatedDeltaNet.log_decay, layer)(inputs(d=64)))
  assert g.shape == (1, 16, 4) and np.all(g < 0)
  assert (layer.head_k, layer.head_v) == (12, 24)
  assert not np.any(np.asarray(layer.g_proj.kernel[...]))
  drawn = GatedDeltaNet(64, 4, rngs=nnx.Rngs(0), zero_init_gate=False)
  assert np.std(np.asarray(drawn.g_proj.kernel[...])) > 0.1


def test_kda_decay_is_per_key_channel():
  layer = KDA(D_MODEL, HEADS, rngs=nnx.Rngs(0))
  g = np.asarray(jitted(KDA.log_decay, layer)(inputs()))
  assert g.shape == (1, 16, HEADS, D_MODEL // HEADS) and np.all(g < 0)
  # Channels of one head decay at different rates.
  assert np.std(g, axis=-1).min() > 0
  a = np.exp(np.asarray(layer.A_log[...]))
  assert np.all((a >= 1) & (a <= 16))


def test_rwkv6_decay_range_at_init():
  layer = RWKV6(64, 4, rngs=nnx.Rngs(0))
  decay = np.exp(np.asarray(jitted(RWKV6.log_decay, layer)(inputs(d=64))))
  low, high = np.exp(-np.exp(-1.0)), np.exp(-np.exp(-6.0))
  assert np.all((decay > low - 1e-3) & (decay < high + 1e-4))
  # The channels span the range, the slowest first.
  assert decay.max() > 0.99 and decay.min() < 0.7
  assert np.all(np.diff(decay[0, 0]) < 1e-3)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rwkv_project_matches_a_plain_matmul(dtype):
  # The layers' gradients are checked mode against mode, all through
  # ``project``: its own gradients are checked here against autodiff.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 5, 6)), dtype)
  kernel = jnp.asarray(rng.normal(size=(6, 3)), dtype)
  cotangent = jnp.asarray(rng.normal(size=(2, 5, 3)), dtype)

  def plain(x, kernel):
    return jnp.einsum("btd,de->bte", x, kernel,
                      preferred_element_type=jnp.float32).astype(dtype)

  got, got_vjp = jax.vjp(products.project, x, kernel)
  want, want_vjp = jax.vjp(plain, x, kernel)
  # bfloat16: both round float32 sums to 8 bits (rms error ~1e-3).
  tol = 1e-6 if dtype == jnp.float32 else 4e-3
  assert got.dtype == dtype
  for a, b in zip((got, *got_vjp(cotangent)), (want, *want_vjp(cotangent))):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert rel_rms(a, b) < tol


@pytest.mark.parametrize("rows", [5, 40])
def test_channel_parameters_match_plain_broadcasts(rows):
  # RWKV-7's per-channel parameters enter through these; their gradients
  # (column sums, two-stage from 32 rows) are checked against autodiff.
  rng = np.random.default_rng(1)
  x, cotangent = (jnp.asarray(rng.normal(size=(2, rows, 6)), jnp.float32)
                  for _ in range(2))
  p = jnp.asarray(rng.normal(size=(6,)), jnp.float32)
  for fast, plain in ((reductions.times_channels, lambda x, p: x * p),
                      (reductions.plus_channels, lambda x, p: x + p)):
    got, got_vjp = jax.vjp(fast, x, p)
    want, want_vjp = jax.vjp(plain, x, p)
    for a, b in zip((got, *got_vjp(cotangent)),
                    (want, *want_vjp(cotangent))):
      assert a.shape == b.shape and a.dtype == b.dtype
      assert rel_rms(a, b) < 1e-6


def test_rwkv7_decay_and_learning_rate_ranges():
  layer = RWKV7(64, 4, rngs=nnx.Rngs(0))
  decay, a = jitted(lambda m, x: (jnp.exp(m.log_decay(x)), m.iclr(x)),
                    layer)(inputs(d=64))
  assert np.all((decay > np.exp(-np.exp(-0.5))) & (decay < 1))
  assert np.all((a > 0) & (a < 1))


def _gradients(layer, x, cotangent):
  """``(y, gradients of sum(y * cotangent))`` in one compiled program."""
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

  def run(params):
    def loss(params):
      y = nnx.merge(graphdef, params, rest)(x)
      return jnp.sum(y * cotangent), y

    grads, y = jax.grad(loss, has_aux=True)(params)
    return y, grads

  return jax.jit(run, compiler_options=lm_checks.FAST_COMPILE)(params)


def test_rwkv7_reference_init_starts_as_identity_but_learns():
  x, cotangent = inputs(), inputs(seed=1)
  y, grads = _gradients(RWKV7(D_MODEL, HEADS, rngs=nnx.Rngs(0)), x,
                        cotangent)
  assert np.all(np.asarray(y) == 0)
  assert np.any(np.asarray(grads["o_proj"]["kernel"][...]) != 0)


def test_rwkv7_zero_gradients_at_init_are_the_documented_ones():
  """With a nonzero output projection, only the second LoRA matrices of the
  decay and the learning rate miss a gradient at init (their inputs are
  ``tanh(0)`` and 0), as the class docstring says."""
  _, grads = _gradients(
      RWKV7(D_MODEL, HEADS, rngs=nnx.Rngs(0), zero_init_output=False),
      inputs(), inputs(seed=1))
  zero = lm_checks.zero_gradient_paths(grads)
  assert sorted(zero) == ["['decay_up'].value", "['iclr_up'].value"], zero


def test_token_shift_restarts_when_a_decoded_token_starts_a_document():
  """RWKV-7 decoding the first token of a new document after a cached
  prefill gives what that token gives alone (zero previous token, zero
  state)."""
  layer = RWKV7(D_MODEL, HEADS, rngs=nnx.Rngs(0), zero_init_output=False)
  x = inputs(length=4)
  seg = jnp.asarray([[0, 0, 0, 1]], jnp.int32)

  def run(layer, x, seg):
    cache = layer.init_cache(1, 4)
    _, cache = layer(x[:, :3], segment_ids=seg[:, :3], cache=cache)
    decoded, _ = layer(x[:, 3:], segment_ids=seg[:, 3:], cache=cache)
    carried, _ = layer(x[:, 3:], cache=cache)
    return decoded, carried, layer(x[:, 3:], mode="recurrent")

  decoded, carried, alone = jitted(run, layer)(x, seg)
  np.testing.assert_allclose(decoded, alone, rtol=1e-5, atol=1e-6)
  assert rel_rms(carried, alone) > 1e-2


@pytest.mark.parametrize("cls, d_model, n_heads, options", [
    (DeltaNet, 32, 2, {"expand_k": 0.3}),
    (GatedDeltaNet, 32, 2, {"expand_v": 1.1}),
    (KDA, 30, 4, {}),
    (RWKV6, 30, 4, {}),
    (RWKV6, 32, 2, {"layer_index": 2, "n_layers": 2}),
    (RWKV7, 30, 4, {}),
    (RWKV7, 32, 2, {"decay_low_rank_dim": 0})])
def test_bad_hyper_parameters_raise(cls, d_model, n_heads, options):
  with pytest.raises(ValueError):
    cls(d_model, n_heads, rngs=nnx.Rngs(0), **options)


@pytest.mark.parametrize("name", sorted(MIXER_OPTIONS))
def test_bfloat16_computation_float32_state(name):
  kw = dict(rngs=nnx.Rngs(0), **MIXER_OPTIONS[name])
  layer = MIXERS[name](D_MODEL, HEADS, dtype=jnp.bfloat16, **kw)
  kw["rngs"] = nnx.Rngs(0)
  reference = MIXERS[name](D_MODEL, HEADS, **kw)

  def run(layer, reference, x):
    y, cache = layer(x.astype(jnp.bfloat16), cache=layer.init_cache(1, 8))
    return y, cache, reference(x)

  y, cache, expected = jitted(run, layer, reference)(inputs(length=8))
  assert y.dtype == jnp.bfloat16
  assert all(leaf.dtype == jnp.float32
             for leaf in jax.tree.leaves(cache["mixer"]))
  assert rel_rms(y, expected) < 5e-2


@pytest.mark.parametrize("cls, module, forms, expected", [
    (DeltaNet, "deltanet", "DELTA_RULE_FORMS", 16),
    (KDA, "deltanet", "DELTA_RULE_FORMS", 16),
    (RWKV6, "rwkv", "RWKV6_FORMS", 16),
    (RWKV7, "rwkv", "RWKV7_FORMS", 16),
])
def test_default_chunk_size_on_cpu(monkeypatch, cls, module, forms, expected):
  # chunk_size=None resolves to base.CPU_CHUNK_SIZE on CPU; an explicit
  # one is kept.
  layer_module = importlib.import_module(f"lin_attn_jax.layers.{module}")
  real = getattr(layer_module, forms)
  seen = []

  def recording(*args, chunk_size, **kwargs):
    seen.append(chunk_size)
    return real.chunk(*args, chunk_size=chunk_size, **kwargs)

  monkeypatch.setattr(layer_module, forms,
                      dataclasses.replace(real, chunk=recording))
  x = inputs(length=8)
  for chunk_size in (None, 8):
    mixer = cls(D_MODEL, HEADS, rngs=nnx.Rngs(0), chunk_size=chunk_size)
    jax.eval_shape(lambda x, mixer=mixer: mixer(x, mode="chunk"), x)
  assert jax.default_backend() == "cpu"
  assert seen == [expected, 8]
