"""HuggingFace-format checkpoints: parity with the reference implementations.

``tests/fixtures/hf/<name>/`` holds a tiny randomly initialised model of the
reference (transformers or flash-linear-attention) saved with
``save_pretrained``, and its float32 logits for a full forward pass and for
a prefill of ``prefill`` tokens followed by token-by-token decoding with its
own cache (``reference.npz``); ``python -m experiments.make_hf_fixtures``
regenerates them (``tests/experiments/test_convert_commands.py`` rebuilds
some with the ``hf`` extra and compares).
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax import convert
from lin_attn_jax.convert import core, safetensors_io
from lin_attn_jax.models.lm import LMConfig
from lin_attn_jax.ops import (chunk_rg_lru, naive_recurrent_rg_lru,
                              parallel_rg_lru, recurrent_rg_lru, rg_lru_step)
from lin_attn_jax.testing import lm_checks
from lin_attn_jax.testing import rel_rms

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                        "fixtures", "hf")
NAMES = sorted(os.listdir(FIXTURES))
# float32 logits of a few layers; the forms differ by reassociation only.
TOL = 1e-5
# transformers' Mamba-2 decoding step does not clamp the time step to
# time_step_limit (its chunked forward does); the fixture's limit is active,
# so the project's decoding (which clamps in every form) is compared with
# the reference's full forward.
DECODE_AGAINST_FULL = {"mamba2"}
# Fixtures of a variant of an architecture, named for the variant.
MODEL_TYPE = {"gla_short_conv": "gla", "path_attn_forget_gate": "path_attn",
              "xlstm_fused": "xlstm", "qwen3_next_hybrid": "qwen3_next",
              "mamba3_mimo": "mamba3"}


def _logits(lm, tokens, prefill):
  """Full-forward logits and prefill + one-token-a-call logits, in one
  compiled program."""
  graphdef, state = nnx.split(lm)
  length = tokens.shape[1]

  def run(state, tokens):
    model = nnx.merge(graphdef, state)
    full = model(tokens)
    cache = model.init_cache(tokens.shape[0], length)
    first, cache = model(tokens[:, :prefill], cache=cache)

    def step(cache, token):
      out, cache = model(token[:, None], cache=cache)
      return cache, out[:, 0]

    _, rest = jax.lax.scan(step, cache, tokens[:, prefill:].T)
    return full, jnp.concatenate([first, jnp.swapaxes(rest, 0, 1)], axis=1)

  return jax.jit(run, compiler_options=lm_checks.FAST_COMPILE)(state, tokens)


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_the_reference(name):
  path = os.path.join(FIXTURES, name)
  reference = np.load(os.path.join(path, "reference.npz"))
  lm, _, hf = convert.load_pretrained(path)
  assert hf["model_type"] == MODEL_TYPE.get(name, name)
  full, decoded = _logits(lm, jnp.asarray(reference["tokens"], jnp.int32),
                          int(reference["prefill"]))
  assert rel_rms(full, reference["full"]) <= TOL
  want = reference["full" if name in DECODE_AGAINST_FULL else "decode"]
  assert rel_rms(decoded, want) <= TOL


def _stored(path):
  infos = safetensors_io.checkpoint_tensors(path)
  return {name: np.asarray(info.read(), np.float32)
          for name, info in infos.items()}


def test_export_writes_the_same_tensors(tmp_path):
  # The architectures whose tables go beyond transposes and copies.
  for name in ("gla_short_conv", "path_attn", "qwen3_next", "rwkv6", "rwkv7",
               "gated_deltaproduct", "xlstm_fused", "comba", "mamba3",
               "mamba3_mimo",
               "log_linear_mamba2", "mesa_net", "falcon_h1", "nemotron_h",
               "granitemoehybrid", "jamba", "lfm2", "qwen3_next_hybrid",
               "kimi_linear", "minimax"):
    path = os.path.join(FIXTURES, name)
    lm, _, hf = convert.load_pretrained(path)
    out = str(tmp_path / name)
    convert.export_pretrained(lm, hf, out)
    original, exported = _stored(path), _stored(out)
    original.pop("lm_head.weight", None) if lm.config.tie_embeddings else None
    assert sorted(exported) == sorted(original), name
    for tensor, value in original.items():
      # 1 + w - 1 may round the zero-centred norm weights in the last bit.
      np.testing.assert_allclose(exported[tensor], value, rtol=0, atol=1e-7,
                                 err_msg=f"{name}: {tensor}")
    with open(os.path.join(out, "config.json")) as f:
      assert json.load(f) == hf


def test_sharded_checkpoint_loads_the_same(tmp_path):
  path = os.path.join(FIXTURES, "rwkv7")
  tensors = _stored(path)
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  out = tmp_path / "sharded"
  out.mkdir()
  shutil.copy(os.path.join(path, "config.json"), out / "config.json")
  for file, part in shards.items():
    safetensors_io.write_file(str(out / file),
                              {n: tensors[n] for n in part})
  with open(out / safetensors_io.INDEX_FILE, "w") as f:
    json.dump({"metadata": {}, "weight_map": {
        n: file for file, part in shards.items() for n in part}}, f)
  _, params, _ = convert.convert_checkpoint(str(out))
  _, want, _ = convert.convert_checkpoint(path)
  jax.tree.map(np.testing.assert_array_equal, params, want)


def _copy_with(tmp_path, name, tensors, label):
  out = tmp_path / label
  out.mkdir()
  shutil.copy(os.path.join(FIXTURES, name, "config.json"), out)
  safetensors_io.write_file(str(out / safetensors_io.SINGLE_FILE), tensors)
  return str(out)


def test_bfloat16_checkpoint_loads_as_float32_or_bfloat16_and_exports(
    tmp_path):
  """A bfloat16 copy of the nemotron_h fixture loads into float32
  parameters exactly as a float32 checkpoint of the same (rounded) values
  does, into bfloat16 parameters as their rounding, and exports back to
  the same bfloat16 bits."""
  bf16 = jnp.bfloat16
  rounded = {n: v.astype(bf16) for n, v in _stored(
      os.path.join(FIXTURES, "nemotron_h")).items()}
  low = _copy_with(tmp_path, "nemotron_h", rounded, "bf16")
  high = _copy_with(tmp_path, "nemotron_h",
                    {n: v.astype(np.float32) for n, v in rounded.items()},
                    "f32")
  assert {i.dtype for i in safetensors_io.checkpoint_tensors(low).values()
          } == {"BF16"}
  lm32, _, hf = convert.load_pretrained(low, param_dtype=jnp.float32)
  want, _, _ = convert.load_pretrained(high)
  state32, state_want = (core.loaded_state(m) for m in (lm32, want))
  jax.tree.map(np.testing.assert_array_equal, state32, state_want)
  lm16, config16, _ = convert.load_pretrained(low, param_dtype=bf16)
  assert config16.param_dtype == bf16
  params16 = nnx.to_pure_dict(nnx.state(lm16, nnx.Param))
  assert {x.dtype for x in jax.tree.leaves(params16)} == {jnp.dtype(bf16)}
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b.astype(bf16)),
               params16, nnx.to_pure_dict(nnx.state(want, nnx.Param)))
  for lm, label in ((lm32, "out32"), (lm16, "out16")):
    out = str(tmp_path / label)
    convert.export_pretrained(lm, hf, out, dtype=bf16)
    exported = {n: i.read()
                for n, i in safetensors_io.checkpoint_tensors(out).items()}
    assert sorted(exported) == sorted(rounded)
    for name, value in rounded.items():
      assert exported[name].dtype == value.dtype, name
      np.testing.assert_array_equal(exported[name].view(np.uint16),
                                    value.view(np.uint16), err_msg=name)
  with pytest.raises(ValueError, match="cannot be exported"):
    convert.export_pretrained(lm32, hf, str(tmp_path / "never"),
                              dtype=np.int8)


@pytest.mark.parametrize("spelling", ['{"__float__": "Infinity"}',
                                      "Infinity"])
def test_mamba2_config_with_an_infinite_time_step_limit_loads(tmp_path,
                                                             spelling):
  """transformers 5.x writes Mamba-2's default ``time_step_limit`` ``(0.0,
  inf)`` as ``[0.0, {"__float__": "Infinity"}]``, older versions as the
  literal ``Infinity``: both load, as no clamp, to the same parameters."""
  out = tmp_path / "mamba2"
  shutil.copytree(os.path.join(FIXTURES, "mamba2"), out)
  with open(out / "config.json") as f:
    text = json.dumps({**json.load(f), "time_step_limit": [0.0, 1.5]})
  with open(out / "config.json", "w") as f:
    f.write(text.replace("1.5", spelling))
  config, params, _ = convert.convert_checkpoint(str(out))
  options = dict(dict(config.mixer_options)["mamba2"])
  assert tuple(options["time_step_limit"]) == (0.0, float("inf"))
  _, want, _ = convert.convert_checkpoint(os.path.join(FIXTURES, "mamba2"))
  jax.tree.map(np.testing.assert_array_equal, params, want)


def _broken_copy(tmp_path, name, edit):
  out = tmp_path / f"broken_{name}_{len(os.listdir(tmp_path))}"
  shutil.copytree(os.path.join(FIXTURES, name), out)
  tensors = _stored(str(out))
  edit(tensors)
  safetensors_io.write_file(str(out / safetensors_io.SINGLE_FILE), tensors)
  return str(out)


def test_bad_checkpoints_name_the_tensor_and_shapes(tmp_path):
  name = "backbone.layers.1.mixer.in_proj.weight"

  def reshape(t):
    t[name] = t[name][:-1]

  with pytest.raises(ValueError, match=rf"{name}.*\[163, 32\].*\[164, 32\]"):
    convert.convert_checkpoint(_broken_copy(tmp_path, "mamba2", reshape))
  with pytest.raises(ValueError, match=rf"{name}.*missing.*\[128, 32\]"):
    convert.convert_checkpoint(_broken_copy(
        tmp_path, "mamba", lambda t: t.pop(name)))

  def integer(t):
    t[name] = t[name].astype(np.int32)

  with pytest.raises(ValueError, match=rf"{name}.*dtype I32"):
    convert.convert_checkpoint(_broken_copy(tmp_path, "mamba2", integer))
  with pytest.raises(ValueError, match="unexpected_extra"):
    convert.convert_checkpoint(_broken_copy(
        tmp_path, "gla", lambda t: t.update(unexpected_extra=np.zeros(2))))
  for update, match in (({"model_type": "llama"}, "model_type = 'llama'"),
                        ({"layer_types": ["linear_attention",
                                          "sliding_attention"]},
                         "layer_types"),
                        ({"hidden_act": "gelu"}, "hidden_act")):
    out = tmp_path / f"config_{len(match)}"
    shutil.copytree(os.path.join(FIXTURES, "qwen3_next"), out)
    with open(out / "config.json") as f:
      config = json.load(f)
    with open(out / "config.json", "w") as f:
      json.dump(dict(config, **update), f)
    with pytest.raises(ValueError, match=match):
      convert.convert_checkpoint(str(out))


def test_config_dict_round_trip():
  config = LMConfig(
      vocab_size=50, d_model=32, n_layers=2, n_heads=2,
      mixer=("rg_lru", "sliding_window_attn"), mlp="geglu", mlp_bias=True,
      embed_scale=5.65625, logits_soft_cap=30.0, dtype=jnp.bfloat16,
      mixer_options={"rg_lru": {"scale_first_token": False},
                     "sliding_window_attn": {"window_size": 4}})
  data = json.loads(json.dumps(config.to_dict()))
  assert LMConfig.from_dict(data) == config
  config = LMConfig(mixer="mamba2", mixer_options={"mamba2": {
      "time_step_limit": (0.0, float("inf"))}})
  assert LMConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
  with pytest.raises(ValueError, match="unknown LMConfig"):
    LMConfig.from_dict({"depth": 3})


def test_rg_lru_unscaled_tokens_in_every_form():
  rng = np.random.default_rng(0)
  b, t, d = 2, 13, 6
  x, a_gate, x_gate = (jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
                       for _ in range(3))
  a_param = jnp.asarray(rng.normal(size=(d,)), jnp.float32)
  unscaled = jnp.asarray(rng.random((b, t)) < 0.3)
  segment_ids = jnp.asarray(np.repeat([[0, 1, 2]], b, 0).repeat(5, 1)[:, :t])
  kw = dict(segment_ids=segment_ids, output_final_state=True)
  want, want_state = naive_recurrent_rg_lru(x, a_gate, x_gate, a_param,
                                            unscaled=unscaled, **kw)
  plain, _ = naive_recurrent_rg_lru(x, a_gate, x_gate, a_param, **kw)
  assert rel_rms(plain, want) > 1e-3
  for form in (parallel_rg_lru, recurrent_rg_lru,
               lambda *a, **k: chunk_rg_lru(*a, chunk_size=4, **k)):
    got, state = form(x, a_gate, x_gate, a_param, unscaled=unscaled, **kw)
    assert rel_rms(got, want) <= 1e-6 and rel_rms(state, want_state) <= 1e-6
  h = jnp.zeros((b, d))
  for i in range(t):
    _, h = rg_lru_step(x[:, i], a_gate[:, i], x_gate[:, i], a_param, h,
                       unscaled=unscaled[:, i],
                       reset=segment_ids[:, i] != segment_ids[:, max(i - 1,
                                                                     0)])
  assert rel_rms(h, want_state) <= 1e-6
  with pytest.raises(ValueError, match=r"unscaled must have shape \[2, 13\]"):
    chunk_rg_lru(x, a_gate, x_gate, a_param, unscaled=unscaled[:, :3])


LM_VARIANTS = {
    "rg_lru-reference": dict(
        mixer="rg_lru", mixer_options={"rg_lru": dict(
            use_bias=True, scale_first_token=False, chunk_size=8)},
        mlp="geglu", mlp_bias=True, embed_scale=5.0, logits_soft_cap=5.0),
    "mamba2-limit": dict(mixer="mamba2", mlp="none", mixer_options={
        "mamba2": dict(d_state=8, head_dim=8, time_step_limit=(0.0, 0.05),
                       chunk_size=8)}),
    "gdn-grouped": dict(mixer="gated_deltanet", mixer_options={
        "gated_deltanet": dict(n_v_heads=4, head_k_dim=8, head_v_dim=6,
                               chunk_size=8)}),
    "rwkv7-value-residual": dict(
        mixer="rwkv7", mlp="rwkv7", norm="layer", embed_norm=True,
        mixer_options={"rwkv7": dict(value_residual=True,
                                     zero_init_output=False, chunk_size=8)}),
}


@pytest.mark.benchmark
@pytest.mark.parametrize("variant", sorted(LM_VARIANTS))
def test_loading_options_agree_over_modes_and_decoding(variant):
  """The options in every mode, with packed documents (the parity tests
  cover the chunk mode and decoding without them); slow to compile."""
  kw = dict(LM_VARIANTS[variant])
  lm = lm_checks.LM(lm_checks.LMConfig(
      vocab_size=lm_checks.VOCAB, d_model=32, n_layers=2, n_heads=2, **kw),
                    rngs=nnx.Rngs(0))
  reference, _ = lm_checks.check_modes(lm, use_segments=True)
  decoded, _ = lm_checks.decode_logits(lm, lm_checks.tokens(),
                                       lm_checks.segments(True))
  assert rel_rms(decoded, reference) <= lm_checks.TOL


def test_forgetting_transformer_exports_and_refuses_a_window(tmp_path):
  """fla's FoX round-trips (q/k norms, output gate, q/k/v biases, grouped
  heads); a window does not load: fla's layer attends to every token in its
  forward pass and only to the window when decoding."""
  path = os.path.join(FIXTURES, "forgetting_transformer")
  lm, config, hf = convert.load_pretrained(path)
  options = config.options_for("forgetting_attn")
  assert options == {"n_kv_heads": 2, "qkv_bias": True, "qk_norm": True,
                     "use_output_gate": True}
  out = str(tmp_path / "fox")
  convert.export_pretrained(lm, hf, out)
  original, exported = _stored(path), _stored(out)
  assert sorted(exported) == sorted(original)
  for tensor, value in original.items():
    np.testing.assert_array_equal(exported[tensor], value, err_msg=tensor)
  with pytest.raises(ValueError, match="window_size = 8"):
    convert.plan(dict(hf, window_size=8))


def test_xlstm_maps_its_options_and_refuses_what_the_lm_lacks():
  """transformers' xLSTM: the mLSTM options (the Wang init's block count
  included), the rounded SwiGLU width and the logit cap reach the LM; norm
  biases and mismatched widths or block counts do not load."""
  with open(os.path.join(FIXTURES, "xlstm", "config.json")) as f:
    hf = json.load(f)
  config, _, _ = convert.plan(hf)
  assert config.options_for("mlstm") == {
      "qk_dim_factor": 1.0, "v_dim_factor": 2.0, "gate_soft_cap": 15.0,
      "norm_eps": 1e-6, "eps": 1e-6, "n_blocks": 2}
  assert (config.mlp_dim, config.logits_soft_cap, config.norm_eps,
          config.tie_embeddings) == (192, 30.0, 1e-6, False)
  for update, match in (({"use_bias": True}, "use_bias = True"),
                        ({"weight_mode": "packed"}, "weight_mode"),
                        ({"embedding_dim": 32}, "embedding_dim = 32"),
                        ({"num_blocks": 3}, "num_blocks = 3")):
    with pytest.raises(ValueError, match=match):
      convert.plan(dict(hf, **update))


def test_log_linear_mamba2_maps_its_options_and_refuses_the_rest():
  """fla's log-linear Mamba-2: the mixer's options reach the LM, the MLP is
  fla's GatedMLP of ratio 4 whatever the file says (its block fixes it);
  options fla's layer refuses, or that the LM's layer lacks, do not load."""
  hf = core.read_config(os.path.join(FIXTURES, "log_linear_mamba2"))
  config, _, _ = convert.plan(dict(hf, intermediate_size=64))
  assert config.options_for("log_linear_mamba2") == {
      "d_state": 8, "d_conv": 4, "n_groups": 2, "head_dim": 16,
      "conv_bias": True, "bias": False, "norm_eps": 1e-5, "dt_min": 0.1,
      "dt_max": 1.0, "dt_init_floor": 1e-4}
  assert (config.n_heads, config.mlp_dim, config.norm_eps,
          config.tie_embeddings) == (4, 256, 1e-5, False)
  for update, match in (({"residual_in_fp32": True}, "residual_in_fp32"),
                        ({"D_has_hdim": True}, "D_has_hdim"),
                        ({"rmsnorm": False}, "rmsnorm = False"),
                        ({"norm_before_gate": True}, "norm_before_gate"),
                        ({"dt_limit": [0.0, 0.5]}, r"dt_limit = \[0.0, 0.5\]"),
                        ({"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
                        ({"attnres_block_size": 2}, "attnres_block_size"),
                        ({"num_heads": 3}, "num_heads \\* head_dim")):
    with pytest.raises(ValueError, match=match):
      convert.plan(dict(hf, **update))


def test_hybrids_map_their_options_and_refuse_the_rest():
  """transformers' hybrids: the pattern of each reaches the LM's per-layer
  mixers and MLPs, the multipliers their places; options the LM cannot
  reproduce do not load, named."""
  def plan(name, **update):
    hf = core.read_config(os.path.join(FIXTURES, name))
    return convert.plan(dict(hf, **update))[0], hf

  config, hf = plan("nemotron_h")
  assert config.layer_mixers == ("mamba2", "softmax_attn", "none", "none")
  assert config.layer_mlps == ("none", "none", "relu2", "moe")
  assert config.options_for("mamba2")["n_heads"] == 8 and config.n_heads == 4
  assert config.options_for("softmax_attn")["rope_fraction"] == 0.0
  assert dict(config.moe_options)["activation"] == "relu2"
  pattern = {k: v for k, v in hf.items() if k != "layers_block_type"}
  assert convert.plan(dict(pattern, hybrid_override_pattern="M*-E"))[0] == (
      config)
  config, _ = plan("falcon_h1")
  assert dict(config.multipliers) == {"logits": 0.7, "mlp_gate": 0.8,
                                      "mlp_out": 1.2}
  assert config.embed_scale == 1.3
  config, _ = plan("granitemoehybrid")
  assert dict(config.multipliers) == {"logits": 0.5, "mixer_out": 0.7,
                                      "mlp_out": 0.7}
  key = config.options_for("softmax_attn")["key_multiplier"]
  assert abs(key - 0.3 * 8 ** 0.5) < 1e-12
  config, _ = plan("granitemoehybrid", num_local_experts=0,
                   position_embedding_type="nope")
  assert config.mlp == "swiglu" and config.mlp_dim == 24
  assert config.options_for("softmax_attn")["rope_fraction"] == 0.0
  config, _ = plan("jamba")
  assert config.layer_mixers == ("mamba", "softmax_attn") * 2
  assert config.layer_mlps == ("moe", "swiglu") * 2
  assert config.options_for("mamba")["inner_norms"]
  config, _ = plan("lfm2", intermediate_size=256, block_multiple_of=64)
  assert config.mlp_dim == 192 and config.layer_mixers == (
      "short_conv", "softmax_attn", "short_conv")
  for name, update, match in (
      ("falcon_h1", {"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
      ("falcon_h1", {"mamba_d_head": 6}, "mamba_d_head"),
      ("falcon_h1", {"rope_parameters": {"rope_type": "yarn"}}, "rope_type"),
      ("falcon_h1", {"ssm_multipliers": [1.0] * 4}, "ssm_multipliers"),
      ("nemotron_h", {"mlp_hidden_act": "silu"}, "mlp_hidden_act"),
      ("nemotron_h", {"moe_latent_size": 8}, "moe_latent_size"),
      ("nemotron_h", {"num_nextn_predict_layers": 1},
       "num_nextn_predict_layers"),
      ("nemotron_h", {"layers_block_type": ["mamba", "conv"]},
       "layers_block_type"),
      ("granitemoehybrid", {"position_embedding_type": "alibi"},
       "position_embedding_type"),
      ("granitemoehybrid", {"layer_types": ["mamba"]}, "layer_types"),
      ("granitemoehybrid", {"logits_scaling": 0.0}, "logits_scaling"),
      ("jamba", {"sliding_window": 4}, "sliding_window"),
      ("lfm2", {"layer_types": ["conv", "sliding_attention", "conv"]},
       "layer_types")):
    with pytest.raises(ValueError, match=match):
      plan(name, **update)
def _hf(name):
  return core.read_config(os.path.join(FIXTURES, name))


def test_hybrids_map_their_options():
  """Qwen3-Next, Kimi Linear and MiniMax: each layer's mixer and MLP, the
  routers' options and MiniMax's residual factors reach the LM; Kimi's and
  MiniMax's original config spellings give the same LM."""
  config, _, _ = convert.plan(_hf("qwen3_next_hybrid"))
  assert config.layer_mixers == ("gated_deltanet", "gated_attn") * 2
  assert config.layer_mlps == ("swiglu", "moe", "moe", "moe")
  assert config.options_for("gated_attn") == {
      "n_kv_heads": 2, "head_dim": 16, "rope_base": 10000.0,
      "rope_fraction": 0.25, "qk_norm_eps": 1e-6, "qkv_bias": False,
      "out_bias": False}
  assert config.options_for("gated_deltanet")["n_heads"] == 2
  assert dict(config.moe_options) == {
      "n_experts": 4, "top_k": 2, "expert_dim": 16, "score": "softmax",
      "normalize_topk": True, "shared_dim": 24, "shared_gate": True}
  kimi = _hf("kimi_linear")
  config, _, _ = convert.plan(kimi)
  assert config.layer_mixers == ("kda", "mla") * 2
  assert config.layer_mlps == ("swiglu", "moe", "moe", "moe")
  assert dict(config.moe_options) == {
      "n_experts": 8, "top_k": 2, "expert_dim": 16, "score": "sigmoid",
      "selection_bias": True, "n_groups": 2, "topk_groups": 1,
      "normalize_topk": True, "routed_scale": 2.446, "shared_dim": 16}
  original = {k: v for k, v in kimi.items()
              if k not in ("layer_types", "mlp_layer_types", "linear_head_dim",
                           "linear_num_heads", "linear_conv_kernel_dim")}
  original.update(first_k_dense_replace=1, linear_attn_config={
      "full_attn_layers": [2, 4], "kda_layers": [1, 3], "head_dim": 8,
      "num_heads": 2, "short_conv_kernel_size": 4})
  assert convert.plan(original)[0] == config
  minimax = _hf("minimax")
  config, _, _ = convert.plan(minimax)
  assert config.residual_from_norm
  assert dict(config.multipliers) == {
      "mixer_residual": (1.7, 1.3, 1.7, 1.7), "mixer_out": (1.1, 0.9, 1.1, 1.1),
      "mlp_residual": 1.2, "mlp_out": 0.8}
  listed = {k: v for k, v in minimax.items() if k != "layer_types"}
  assert convert.plan(dict(listed, attn_type_list=[0, 1, 0, 0]))[0] == config


@pytest.mark.parametrize("name, update, match", [
    ("qwen3_next_hybrid", {"rope_parameters": {"rope_type": "yarn",
                                               "factor": 2.0}}, "rope_type"),
    ("qwen3_next_hybrid", {"shared_expert_intermediate_size": 0},
     "shared_expert_intermediate_size"),
    ("qwen3_next_hybrid", {"layer_types": ["linear_attention"] * 3},
     "layer_types"),
    ("kimi_linear", {"num_key_value_heads": 2}, "num_key_value_heads"),
    ("kimi_linear", {"hidden_act": "gelu"}, "hidden_act"),
    ("kimi_linear", {"mlp_layer_types": ["dense", "moe", "moe", "moe"]},
     "mlp_layer_types"),
    ("minimax", {"sliding_window": 8}, "sliding_window"),
    ("minimax", {"attn_type_list": [0, 2, 0, 0], "layer_types": None},
     "layer_types"),
    ("minimax", {"rope_scaling": {"type": "linear"}}, "rope_scaling"),
])
def test_hybrids_refuse_what_the_lm_lacks(name, update, match):
  with pytest.raises(ValueError, match=match):
    convert.plan(dict(_hf(name), **update))
