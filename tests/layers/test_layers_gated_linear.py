"""Mixers on the gated-linear-attention core, each inside a 2-layer LM."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import GLA, HGRN2, MIXERS, Based, Performer, modules
from lin_attn_jax.layers.performer import RandomProjection
from lin_attn_jax.testing import lm_checks

# Small chunks, so that the 24-token test sequences span several chunks.
MIXER_OPTIONS = {
    "gla": {"chunk_size": 8},
    "linear_attn": {"chunk_size": 8},
    "performer": {"chunk_size": 8, "nb_features": 32},
    # A window of 6 so that it cuts the 24-token sequences.
    "based": {"chunk_size": 8, "window_size": 6},
    "retnet": {"chunk_size": 8},
    "hgrn2": {"chunk_size": 8, "expand_ratio": 16},
    "mlstm": {"chunk_size": 8},
    "mamba3": {"chunk_size": 8, "d_state": 16},
    "mesa_net": {"chunk_size": 8},
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


# ``use_short_conv`` (fla's option): q, k and v each through a causal
# depthwise convolution; a 3-tap window with a bias, so that the cached
# windows and the bias are exercised.
SHORT_CONV = {"use_short_conv": True, "conv_size": 3, "conv_bias": True}


# Mamba-3 MIMO (rank 3, grouped B and C, with and without the per-head
# output norm) in every mode.
@pytest.mark.parametrize("outproj_norm", [
    False, pytest.param(True, marks=pytest.mark.slow)])
def test_mamba3_mimo_modes_decoding_and_gradients(outproj_norm):
  lm_checks.check_mixer(
      lm_checks.tiny_lm("mamba3", {**MIXER_OPTIONS["mamba3"], "is_mimo": True,
                                   "mimo_rank": 3, "n_groups": 2,
                                   "is_outproj_norm": outproj_norm}),
      use_segments=True)


# GLA's in the fast suite, the others' in the slow one (the same convolution
# code in front of each).
# Slow: the convolutions' cache in decoding runs in the fast suite through
# the layers that have them on by default (DeltaNet and its kin, Comba,
# MesaNet, FoX).
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gla", "based", "hgrn2", "linear_attn",
                                  "retnet"])
def test_short_conv_modes_decoding_and_gradients(name):
  lm_checks.check_mixer(
      lm_checks.tiny_lm(name, {**MIXER_OPTIONS[name], **SHORT_CONV}),
      use_segments=True)


@pytest.mark.parametrize("name", ["based", "gla", "hgrn2", "linear_attn",
                                  "retnet"])
def test_short_conv_changes_the_output_and_is_causal(name):
  """The convolutions act (the output differs from the same weights without
  them), and token t of the output does not depend on later tokens."""
  on = MIXERS[name](32, 2, rngs=nnx.Rngs(0),
                    **{**MIXER_OPTIONS[name], **SHORT_CONV})
  off = MIXERS[name](32, 2, rngs=nnx.Rngs(0), **MIXER_OPTIONS[name])
  x = _x((2, 12, 32))
  x2 = x.at[:, 7:].set(_x((2, 5, 32), seed=3))
  y, y2, y_off = _both_inputs(on, off, x, x2)
  assert lm_checks.rel_rms(y, y_off) > 1e-2
  np.testing.assert_allclose(y2[:, :7], y[:, :7], atol=1e-6)
  assert lm_checks.rel_rms(y2[:, 7:], y[:, 7:]) > 1e-2


@nnx.jit
def _both_inputs(on, off, x, x2):
  """``on(x)``, ``on(x2)`` and ``off(x)``, one compiled program."""
  return on(x), on(x2), off(x)


def test_short_conv_cache_layout():
  layer = GLA(32, 2, rngs=nnx.Rngs(0), **SHORT_CONV)
  cache = layer.init_cache(3, 24)["mixer"]
  assert _shapes(cache) == {
      "conv": {"q": ((3, 2, 16), jnp.float32), "k": ((3, 2, 16), jnp.float32),
               "v": ((3, 2, 32), jnp.float32)},
      "state": ((3, 2, 8, 16), jnp.float32)}


def test_gla_gates_start_close_to_one():
  layer = GLA(64, 4, rngs=nnx.Rngs(0))
  x = np.random.default_rng(0).normal(size=(1, 16, 64)).astype(np.float32)
  g = np.log(1 / (1 + np.exp(-np.asarray(layer.gate_up(layer.gate_down(x))))))
  g = g / layer.gate_logit_normalizer
  assert np.all(g <= 0) and np.mean(np.exp(g)) > 0.9


def _x(shape, seed=0, dtype=np.float32):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def _shapes(tree):
  return jax.tree.map(lambda a: (tuple(a.shape), jnp.dtype(a.dtype)), tree)


# What decoding needs, for d_model 32, 2 heads (head width 16), batch 3.
CACHE_SHAPES = {
    "linear_attn": {"state": (3, 2, 16, 17)},
    "performer": {"state": (3, 2, 32, 17)},
    "based": {"state": (3, 2, 1 + 16 + 256, 17), "window_k": (3, 6, 2, 16)},
    "retnet": {"state": (3, 2, 16, 32)},
    "hgrn2": {"state": (3, 2, 16, 16)},
}


@pytest.mark.parametrize("name", sorted(CACHE_SHAPES))
def test_cache_holds_only_decoding_state(name):
  dtype = jnp.bfloat16
  layer = MIXERS[name](32, 2, rngs=nnx.Rngs(0), dtype=dtype, param_dtype=dtype,
                       **MIXER_OPTIONS[name])
  cache = layer.init_cache(3, 24, dtype)
  mixer_cache = cache["mixer"]
  if name == "based":
    assert set(mixer_cache) == {"state", "window"}
    window = mixer_cache["window"]
    assert window.window_size == 6
    assert _shapes(window.k) == (CACHE_SHAPES[name]["window_k"], dtype)
    assert _shapes(window.v) == (CACHE_SHAPES[name]["window_k"], dtype)
    state = mixer_cache["state"]
  else:
    state = mixer_cache
  assert _shapes(state) == (CACHE_SHAPES[name]["state"], jnp.float32)

  def run(layer, x, cache):
    y, cache = layer(x, cache=cache)
    y1, cache = layer(x[:, :1], cache=cache)
    return y, y1, cache

  y, y1, new_cache = jax.eval_shape(run, layer, _x((3, 5, 32), dtype=dtype),
                                    cache)
  assert y.dtype == y1.dtype == dtype
  assert _shapes(new_cache) == _shapes(cache)
  assert all(p.dtype == dtype for p in jax.tree.leaves(nnx.state(layer,
                                                                 nnx.Param)))


@pytest.mark.parametrize("name, options, message", [
    ("linear_attn", {"feature_map": "identity"}, "positive features"),
    ("linear_attn", {"feature_map": "softplus"}, "feature_map must be"),
    ("performer", {"nb_features": 0}, "nb_features"),
    ("based", {"window_size": 0}, "window_size"),
    ("based", {"feature_dim": 0}, "feature_dim"),
    ("retnet", {"expand_v": 1.1}, "expand_v"),
    ("hgrn2", {"lower_bound": 1.0}, "lower_bound"),
    ("hgrn2", {"expand_ratio": 0}, "expand_ratio"),
])
def test_bad_options_raise(name, options, message):
  with pytest.raises(ValueError, match=message):
    MIXERS[name](32, 2, rngs=nnx.Rngs(0), **options)


@pytest.mark.parametrize("name", sorted(CACHE_SHAPES))
def test_heads_must_divide_the_width(name):
  with pytest.raises(ValueError, match="n_heads"):
    MIXERS[name](30, 4, rngs=nnx.Rngs(0))


@functools.partial(jax.jit, static_argnums=(0, 1),
                   compiler_options=lm_checks.FAST_COMPILE)
def _apply(graphdef, modes, state, x):
  """A layer's outputs in each of ``modes``, compiled once per layer shape."""
  layer = nnx.merge(graphdef, state)
  return [layer(x, mode=mode) for mode in modes]


def _outputs(layer, x, modes=("chunk",)):
  graphdef, state = nnx.split(layer)
  return [np.asarray(y, np.float64) for y in _apply(graphdef, modes, state, x)]


@functools.partial(jax.jit, static_argnums=0,
                   compiler_options=lm_checks.FAST_COMPILE)
def _prefill_each_mode(graphdef, state, cache, x, segment_ids):
  """Two cached prefills (8 tokens, then the rest) in every mode."""
  layer = nnx.merge(graphdef, state)
  out = {}
  for mode in ("chunk", "parallel", "recurrent"):
    y1, c = layer(x[:, :8], segment_ids=segment_ids[:, :8], mode=mode,
                  cache=cache)
    y2, c = layer(x[:, 8:], segment_ids=segment_ids[:, 8:], mode=mode,
                  cache=c)
    out[mode] = (jnp.concatenate([y1, y2], axis=1), c)
  return out


def test_based_cached_prefill_agrees_across_modes():
  # The window branch continues from its KV cache by one softmax_attn_extend
  # per call (chunk, parallel) or by a step per token (recurrent); the other
  # mixers pass their cache to the op forms as initial_state in every mode.
  layer = Based(32, 2, rngs=nnx.Rngs(0), **MIXER_OPTIONS["based"])
  graphdef, state = nnx.split(layer)
  segment_ids = jnp.asarray(lm_checks.SEGMENT_IDS[:, :13])
  out = _prefill_each_mode(graphdef, state, layer.init_cache(2, 13),
                           _x((2, 13, 32)), segment_ids)
  y, cache = out["chunk"]
  for mode in ("parallel", "recurrent"):
    assert lm_checks.rel_rms(out[mode][0], y) < 1e-5, mode
    for leaf, ref in zip(jax.tree.leaves(out[mode][1]),
                         jax.tree.leaves(cache)):
      np.testing.assert_allclose(leaf, ref, rtol=1e-5, atol=1e-5)


def test_performer_default_features_follow_the_head_width():
  # int(K ln K): K = 32 -> 110, K = 64 -> 266; an explicit count is kept.
  for d_model, heads, expected in ((64, 2, 110), (128, 2, 266), (8, 4, 2)):
    layer = Performer(d_model, heads, rngs=nnx.Rngs(0))
    assert layer.nb_features == expected
    assert layer.projection[...].shape == (expected, d_model // heads)
  assert Performer(64, 2, rngs=nnx.Rngs(0), nb_features=24).nb_features == 24


def test_performer_redraw_changes_projection_and_outputs_not_gradients():
  layer = Performer(32, 2, rngs=nnx.Rngs(0), nb_features=16)
  x = _x((1, 7, 32))
  projection, (y,) = np.asarray(layer.projection[...]), _outputs(layer, x)
  assert isinstance(layer.projection, RandomProjection)
  assert not isinstance(layer.projection, nnx.Param)
  layer.redraw(jax.random.PRNGKey(7))
  assert layer.projection[...].shape == projection.shape
  assert np.max(np.abs(layer.projection[...] - projection)) > 0.1
  assert lm_checks.rel_rms(_outputs(layer, x)[0], y) > 1e-3

  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

  def names(state):
    return {path[0] for path, _ in nnx.to_flat_state(state)}

  assert "projection" not in names(params)
  assert names(rest) == {"projection"}

  def loss(params):
    return jnp.sum(nnx.merge(graphdef, params, rest)(x) ** 2)

  grads = jax.jit(jax.grad(loss), compiler_options=lm_checks.FAST_COMPILE)(
      params)
  assert names(grads) == names(params)
  assert not lm_checks.zero_gradient_paths(grads)


def _causal_softmax(q, k, v, scale, window=None):
  """Dense float64 reference: q, k ``[T, H, K]``, v ``[T, H, V]`` -> o
  ``[T, H, V]``."""
  t = q.shape[0]
  s = scale * np.einsum("ihk,jhk->hij", q, k)                   # [H, T, T]
  i, j = np.arange(t)[:, None], np.arange(t)[None]
  allowed = (j <= i) if window is None else (j <= i) & (j > i - window)
  s = np.where(allowed, s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("hij,jhv->ihv", p, v)                        # [T, H, V]


def _weight(linear):
  return np.asarray(linear.kernel[...], np.float64)


def test_performer_estimates_softmax_attention():
  layer = Performer(32, 2, rngs=nnx.Rngs(0), nb_features=4096)
  # Small enough q and k for the estimator's variance, which grows as
  # exp(|q + k|^2 / sqrt(K)), to be small with 4096 features.
  x = _x((1, 12, 32)) * 0.3
  xs = np.asarray(x[0], np.float64)
  q, k, v = ((xs @ _weight(p)).reshape(12, 2, 16)
             for p in (layer.q_proj, layer.k_proj, layer.v_proj))
  out = _weight(layer.o_proj)
  exact = _causal_softmax(q, k, v, 16 ** -0.5).reshape(12, 32) @ out
  uniform = _causal_softmax(0 * q, k, v, 1.0).reshape(12, 32) @ out
  error = lm_checks.rel_rms(_outputs(layer, x)[0][0], exact)
  assert error < 0.2 * lm_checks.rel_rms(uniform, exact), error


def test_based_sums_taylor_linear_and_window_softmax():
  f, w = 4, 3
  layer = Based(32, 2, rngs=nnx.Rngs(0), feature_dim=f, window_size=w)
  for proj in (layer.q_proj, layer.k_proj, layer.window_q_proj,
               layer.window_k_proj):
    proj.kernel[...] = proj.kernel[...] * 40.0
  x = _x((1, 11, 32))
  xs = np.asarray(x[0], np.float64)
  q, k = (xs @ _weight(p) for p in (layer.q_proj, layer.k_proj))
  v = (xs @ _weight(layer.v_proj)).reshape(11, 2, 16)
  dot = np.einsum("ihf,jhf->hij", q.reshape(11, 2, f),
                  k.reshape(11, 2, f)) * f ** -0.5          # [H, T, T]
  kernel = np.tril(1 + dot + dot ** 2 / 2)
  linear = np.einsum("hij,jhv->ihv", kernel, v) / (
      kernel.sum(-1).T[..., None] + 1e-6)
  positions = jnp.arange(11)[None]
  wq, wk = (np.asarray(modules.rotary(jnp.asarray(
      xs @ _weight(p), jnp.float32).reshape(1, 11, 2, 16), positions)[0],
                       np.float64)
            for p in (layer.window_q_proj, layer.window_k_proj))
  window = _causal_softmax(wq, wk, v, 16 ** -0.5, window=w)
  expected = (linear + window).reshape(11, 32) @ _weight(layer.o_proj)
  modes = ("parallel", "chunk", "recurrent")
  for mode, y in zip(modes, _outputs(layer, x, modes)):
    assert lm_checks.rel_rms(y[0], expected) < 1e-5, mode
  assert lm_checks.rel_rms(window, _causal_softmax(wq, wk, v, 16 ** -0.5)) > 0.1


def test_hgrn2_forget_gate_is_lower_bounded_and_ties_the_input_gate():
  layer = HGRN2(32, 2, rngs=nnx.Rngs(0), expand_ratio=8, lower_bound=0.3)
  g, k = layer.gates(layer.f_proj(_x((2, 9, 32)) * 10))
  f = np.exp(np.asarray(g, np.float64))
  assert np.all(f >= 0.3 - 1e-6) and np.all(f <= 1.0)
  assert f.min() < 0.31 and f.max() > 0.99
  np.testing.assert_allclose(np.asarray(k), 1 - f, atol=1e-6)


def test_hgrn2_default_state_is_square():
  """As in the reference, the forget width is D: K = V = D / H per head."""
  layer = HGRN2(64, 2, rngs=nnx.Rngs(0))
  assert (layer.head_k, layer.head_v) == (32, 32)
  assert layer.q_proj.kernel.shape == (64, 64)
  assert HGRN2(64, 2, rngs=nnx.Rngs(0), expand_ratio=128).head_k == 128
