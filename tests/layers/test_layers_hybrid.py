"""The attention layers and blocks of hybrid checkpoints: Qwen3-Next's gated
attention, MLA (DeepSeek-V3, Kimi Linear), LFM2's gated short convolution
and Falcon-H1's parallel attention + Mamba-2 mixer.

Each against transformers' layer (tests/fixtures/hybrid_layers, made by
``python -m experiments.make_layer_fixtures``), and inside a 2-layer LM:
modes, prefill + token-by-token decoding against the full forward (with
packed documents), gradients, and a sequence split over devices.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import (MIXERS, FalconH1Parallel, GatedAttention,
                                 GatedShortConv, MultiHeadLatentAttention,
                                 SoftmaxAttention)
from lin_attn_jax.testing import lm_checks, rel_rms

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures",
                        "hybrid_layers")
D_MODEL = 32
# Float32 layers against transformers' float32 layers: reassociation only.
TOL = 1e-5


def _t(name):
  """A transformers ``Linear`` weight ``[out, in]`` as a kernel ``[in,
  out]``."""
  return lambda p: p[name].T


def _conv(name):
  """A ``Conv1d`` weight ``[C, 1, W]`` as ``[C, W]``."""
  return lambda p: p[name][:, 0]


def _same(name):
  return lambda p: p[name]


# Per fixture: the mixer, its options, and each of our parameters from the
# fixture's transformers parameters.
CASES = {
    "qwen3_next_attention": (GatedAttention, dict(
        n_heads=4, n_kv_heads=2, head_dim=16), {
            "q_proj.kernel": _t("q_proj.weight"),
            "k_proj.kernel": _t("k_proj.weight"),
            "v_proj.kernel": _t("v_proj.weight"),
            "o_proj.kernel": _t("o_proj.weight"),
            "q_norm.scale": _same("q_norm.weight"),
            "k_norm.scale": _same("k_norm.weight")}),
    "deepseek_v3_mla": (MultiHeadLatentAttention, dict(
        n_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=6, rope_interleave=True), {
            "q_a_proj.kernel": _t("q_a_proj.weight"),
            "q_a_norm.scale": _same("q_a_layernorm.weight"),
            "q_b_proj.kernel": _t("q_b_proj.weight"),
            "kv_a_proj.kernel": _t("kv_a_proj_with_mqa.weight"),
            "kv_a_norm.scale": _same("kv_a_layernorm.weight"),
            "kv_b_proj.kernel": _t("kv_b_proj.weight"),
            "o_proj.kernel": _t("o_proj.weight")}),
    "kimi_mla": (MultiHeadLatentAttention, dict(
        n_heads=4, kv_lora_rank=10, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=6, use_rope=False), {
            "q_proj.kernel": _t("q_proj.weight"),
            "kv_a_proj.kernel": _t("kv_a_proj_with_mqa.weight"),
            "kv_a_norm.scale": _same("kv_a_layernorm.weight"),
            "kv_b_proj.kernel": _t("kv_b_proj.weight"),
            "o_proj.kernel": _t("o_proj.weight")}),
    "lfm2_short_conv": (GatedShortConv, dict(
        n_heads=1, conv_size=3, bias=True), {
            "in_proj.kernel": _t("in_proj.weight"),
            "in_proj.bias": _same("in_proj.bias"),
            "conv.weight": _conv("conv.weight"),
            "conv.bias": _same("conv.bias"),
            "out_proj.kernel": _t("out_proj.weight"),
            "out_proj.bias": _same("out_proj.bias")}),
    "falcon_h1_parallel": (FalconH1Parallel, dict(
        n_heads=4, n_kv_heads=2, mamba_n_heads=6, mamba_head_dim=8,
        d_state=8, n_groups=2, d_conv=4, mamba_rms_norm=True,
        key_multiplier=0.7, attention_in_multiplier=1.3,
        attention_out_multiplier=0.8, ssm_in_multiplier=1.1,
        ssm_out_multiplier=0.9, ssm_multipliers=(0.5, 1.5, 0.8, 1.2, 0.6),
        chunk_size=4), {
            **{f"self_attn.{p}_proj.kernel": _t(f"self_attn.{p}_proj.weight")
               for p in "qkvo"},
            "mamba.in_proj.kernel": _t("mamba.in_proj.weight"),
            "mamba.conv.weight": _conv("mamba.conv1d.weight"),
            "mamba.conv.bias": _same("mamba.conv1d.bias"),
            **{f"mamba.{p}": _same(f"mamba.{p}")
               for p in ("dt_bias", "A_log", "D")},
            "mamba.norm.scale": _same("mamba.norm.weight"),
            "mamba.out_proj.kernel": _t("mamba.out_proj.weight")}),
}


def _fixture(name):
  with np.load(os.path.join(FIXTURES, f"{name}.npz")) as data:
    params = {k[len("param/"):]: data[k] for k in data.files
              if k.startswith("param/")}
    return data["x"], data["y"], params


def loaded(name):
  """``(mixer with the fixture's parameters, x, transformers' y)``; every
  parameter of the mixer is set, every fixture parameter used."""
  cls, options, mapping = CASES[name]
  options = dict(options)
  x, y, params = _fixture(name)
  mixer = cls(D_MODEL, options.pop("n_heads"), rngs=nnx.Rngs(0), **options)
  ours = {jax.tree_util.keystr(path, simple=True,
                               separator=".").removesuffix(".value")
          for path, _ in jax.tree_util.tree_flatten_with_path(
              nnx.state(mixer, nnx.Param))[0]}
  assert set(ours) == set(mapping), sorted(set(ours) ^ set(mapping))
  assert set(params) == _sources(mapping, params)
  for target, source in mapping.items():
    value = source(params)
    module = functools.reduce(getattr, target.split(".")[:-1], mixer)
    var = getattr(module, target.split(".")[-1])
    assert var[...].shape == value.shape, (target, value.shape)
    var[...] = jnp.asarray(value)
  return mixer, jnp.asarray(x), np.asarray(y)


def _sources(mapping, params):
  """The fixture parameters that ``mapping`` reads."""
  read = set()

  class Recorder(dict):
    def __getitem__(self, key):
      read.add(key)
      return dict.__getitem__(self, key)

  recorder = Recorder(params)
  for source in mapping.values():
    source(recorder)
  return read


_forward = nnx.jit(lambda mixer, x: mixer(x))
_decode = nnx.jit(lambda mixer, x, cache: mixer(x, cache=cache))


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_transformers(name):
  """The layer with transformers' parameters gives transformers' output,
  in chunk mode and from a prefill and one token a call."""
  mixer, x, y = loaded(name)
  assert rel_rms(_forward(mixer, x), y) <= TOL
  cache = mixer.init_cache(x.shape[0], x.shape[1])
  out, cache = _decode(mixer, x[:, :4], cache)
  outs = [out]
  for t in range(4, x.shape[1]):
    out, cache = _decode(mixer, x[:, t:t + 1], cache)
    outs.append(out)
  assert rel_rms(jnp.concatenate(outs, axis=1), y) <= TOL


def test_fixture_parameters_are_not_trivial():
  """The fixtures' norms and gates are drawn, not at their inits (a
  zero-centred norm's zero scale, a bias of zeros), so that a mapping
  that skipped them would fail."""
  for name in CASES:
    _, _, params = _fixture(name)
    for key, value in params.items():
      assert np.std(value) > 0.1, (name, key)


# Small blocks and chunks, so that the LM checks' 24-token sequences span
# several of them.
LM_CASES = {
    "gated_attn": {"block_size": 8, "n_kv_heads": 1, "head_dim": 24},
    "mla": {"block_size": 8, "q_lora_rank": 8},
    "mla_nope": {"block_size": 8, "use_rope": False},
    "short_conv": {},
    "falcon_h1_parallel": {"block_size": 8, "chunk_size": 4, "d_state": 8,
                           "n_kv_heads": 1, "mamba_rms_norm": True,
                           "ssm_multipliers": (0.5, 1.5, 0.8, 1.2, 0.6),
                           "attention_in_multiplier": 1.3,
                           "ssm_out_multiplier": 0.9},
}


def _tiny_lm(case):
  return lm_checks.tiny_lm(case.removesuffix("_nope"), LM_CASES[case])


# MLA without RoPE runs the same code as with it: slow only.
# MLA without RoPE and the gated attention (softmax attention with options)
# run in the slow suite only.
LM_RUNS = [pytest.param(case, marks=pytest.mark.slow
                        if case in ("mla_nope", "gated_attn") else ())
           for case in sorted(LM_CASES)]


@pytest.mark.parametrize("case", LM_RUNS)
def test_modes_decoding_and_gradients(case):
  lm_checks.check_mixer(_tiny_lm(case), use_segments=True)


def test_mla_absorbed_gradients_are_the_expanded_ones():
  """MLA's recurrent mode runs the absorbed form over the latent cache, the
  chunk mode the expanded keys and values: their parameter gradients
  agree."""
  lm = _tiny_lm("mla")
  chunk = lm_checks.param_gradients(lm, use_segments=True, mode="chunk")
  absorbed = lm_checks.param_gradients(lm, use_segments=True,
                                       mode="recurrent")
  errors = jax.tree.map(rel_rms, absorbed, chunk)
  assert max(jax.tree.leaves(errors)) <= 1e-4, errors


def test_mla_caches_the_latent():
  """The cache holds ``r + d_R`` floats per token and nothing per head."""
  mixer = MultiHeadLatentAttention(32, 4, rngs=nnx.Rngs(0), kv_lora_rank=6,
                                   qk_rope_head_dim=4)
  cache = mixer.init_cache(2, 10)["mixer"]
  assert cache.k.shape == (2, 10, 1, 10) and cache.v.shape == (2, 10, 1, 0)
  assert mixer.state_size(10) == 10 * (6 + 4)


def test_gated_attention_options():
  """Qwen3-Next's defaults, and the gate's and norms' parameters."""
  layer = GatedAttention(32, 2, rngs=nnx.Rngs(0))
  assert layer.rope_dim == 4 and layer.q_proj.kernel.shape == (32, 64)
  assert np.all(np.asarray(layer.q_norm.scale[...]) == 0)
  plain = SoftmaxAttention(32, 2, rngs=nnx.Rngs(0))
  assert plain.q_norm is None and not plain.output_gate
  with pytest.raises(ValueError, match="qk_norm"):
    SoftmaxAttention(32, 2, rngs=nnx.Rngs(0), qk_norm="layer")
  with pytest.raises(ValueError, match="rope_fraction"):
    GatedAttention(32, 2, rngs=nnx.Rngs(0), head_dim=12, rope_fraction=0.25)


def test_registered():
  assert {"gated_attn": GatedAttention, "mla": MultiHeadLatentAttention,
          "short_conv": GatedShortConv,
          "falcon_h1_parallel": FalconH1Parallel}.items() <= MIXERS.items()


# Gated attention splits as softmax attention (tested with the op): slow
# only.
@pytest.mark.parametrize("name", [
    pytest.param("gated_attn", marks=pytest.mark.slow), "mla", "short_conv",
    pytest.param("falcon_h1_parallel", marks=pytest.mark.slow)])
def test_sequence_split_over_devices(name):
  """Chunk mode under a mesh with a ``"sequence"`` axis of 4 devices gives
  the one-device output and parameter gradients."""
  options = {k: v for k, v in LM_CASES[name].items() if k != "head_dim"}
  mixer = MIXERS[name](D_MODEL, 2, rngs=nnx.Rngs(0), **options)
  graphdef, params = nnx.split(mixer)
  x = jax.random.normal(jax.random.key(1), (2, 16, D_MODEL))
  cotangent = jax.random.normal(jax.random.key(2), x.shape)
  segment_ids = jnp.asarray([[0] * 6 + [1] * 10, [2] * 16], jnp.int32)

  def loss(params, x):
    y = nnx.merge(graphdef, params)(x, segment_ids=segment_ids)
    return jnp.sum(y * cotangent), y

  run = jax.jit(jax.value_and_grad(loss, has_aux=True),
                compiler_options=lm_checks.FAST_COMPILE)
  (_, y), grads = run(params, x)
  mesh = jax.make_mesh((4,), ("sequence",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  with jax.set_mesh(mesh):
    (_, y_split), grads_split = run(params, x)
  assert rel_rms(y_split, y) <= 1e-5
  errors = jax.tree.map(rel_rms, grads_split, grads)
  assert max(jax.tree.leaves(errors)) <= 1e-4, errors
