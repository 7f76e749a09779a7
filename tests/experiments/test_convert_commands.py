"""The checkpoint commands of the experiments: ``experiments.convert`` writes
a workdir that ``experiments.generate`` reads, and
``experiments.make_hf_fixtures`` rebuilds the references of
``tests/fixtures/hf`` (with the ``hf`` extra installed); without a workdir
``experiments.generate``'s model takes ``--config.model.<field>``
overrides."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments import config_flags
from experiments import convert as convert_command
from experiments import generate
from lin_attn_jax import convert
from lin_attn_jax.testing import rel_rms
from tests.convert.test_convert import FIXTURES, TOL, _broken_copy, _logits


def test_convert_command_writes_a_workdir_generate_reads(tmp_path):
  work = str(tmp_path / "work")
  convert_command.convert(os.path.join(FIXTURES, "rwkv6"), work)
  assert sorted(os.listdir(work)) == ["config.json", "hf_config.json",
                                      "params", "tokenizer.json"]
  lm = generate.load_workdir(work)
  want, _, _ = convert.load_pretrained(os.path.join(FIXTURES, "rwkv6"))
  jax.tree.map(np.testing.assert_array_equal,
               nnx.to_pure_dict(nnx.state(lm, nnx.Param)),
               nnx.to_pure_dict(nnx.state(want, nnx.Param)))
  with pytest.raises(ValueError, match="exists"):
    convert_command.convert(os.path.join(FIXTURES, "rwkv6"), work)
  bad = _broken_copy(tmp_path, "mamba",
                     lambda t: t.pop("backbone.norm_f.weight"))
  with pytest.raises(ValueError, match="backbone.norm_f.weight"):
    convert_command.convert(bad, str(tmp_path / "never"))
  assert not os.path.exists(tmp_path / "never")


def test_workdir_keeps_the_router_selection_biases(tmp_path):
  """A nemotron_h workdir stores its routers' selection biases (not
  parameters): the reloaded LM's logits equal ``load_pretrained``'s, and a
  workdir written before variables were stored (parameters alone) still
  loads, with the biases at their initial zeros."""
  import orbax.checkpoint as ocp
  from lin_attn_jax.layers.moe import RouterBias
  from lin_attn_jax.models import checkpoints
  source = os.path.join(FIXTURES, "nemotron_h")
  work = str(tmp_path / "work")
  convert_command.convert(source, work)
  want, _, _ = convert.load_pretrained(source)
  biases = nnx.to_pure_dict(nnx.state(want, RouterBias))
  assert jax.tree.leaves(biases) and all(
      np.abs(b).max() > 0 for b in jax.tree.leaves(biases))
  lm = generate.load_workdir(work)
  tokens = jnp.arange(24, dtype=jnp.int32)[None] % lm.config.vocab_size
  forward = jax.jit(lambda s, t: nnx.merge(nnx.graphdef(lm), s)(t))
  np.testing.assert_array_equal(forward(nnx.state(lm), tokens),
                                forward(nnx.state(want), tokens))
  old = str(tmp_path / "old")
  os.makedirs(old)
  for name in ("config.json", "hf_config.json"):
    with open(os.path.join(work, name)) as f, open(
        os.path.join(old, name), "w") as g:
      g.write(f.read())
  params = checkpoints._string_keys(
      nnx.to_pure_dict(nnx.state(want, nnx.Param)))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(old, "params"), params)
  legacy = generate.load_workdir(old)
  jax.tree.map(np.testing.assert_array_equal,
               nnx.to_pure_dict(nnx.state(legacy, nnx.Param)),
               nnx.to_pure_dict(nnx.state(want, nnx.Param)))
  assert all(np.all(b == 0) for b in jax.tree.leaves(
      nnx.state(legacy, RouterBias)))


def test_init_from_a_workdir_keeps_the_router_selection_biases(tmp_path):
  """``--init_from`` of a converted workdir starts the trainer with the
  stored selection biases in its non-parameter state."""
  from experiments import workdirs
  from lin_attn_jax.layers.moe import RouterBias
  from lin_attn_jax.train import Trainer, TrainConfig
  source = os.path.join(FIXTURES, "nemotron_h")
  work = str(tmp_path / "work")
  convert_command.convert(source, work)
  want, _, _ = convert.load_pretrained(source)
  trainer = Trainer(workdirs.source_model_config(work),
                    TrainConfig(batch_size=8, seq_len=8))
  params, rest, where = workdirs.source_state(work, trainer)
  assert where == os.path.join(work, "params")
  jax.tree.map(np.testing.assert_array_equal,
               nnx.to_pure_dict(nnx.filter_state(rest, RouterBias)),
               nnx.to_pure_dict(nnx.state(want, RouterBias)))
  jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(params),
               nnx.to_pure_dict(nnx.state(want, nnx.Param)))


def test_generate_model_takes_dotted_overrides():
  assert generate.model_config({}) == generate.MODEL
  config = generate.model_config({"mixer": "gla,softmax_attn",
                                  "n_layers": "2", "d_model": "64"})
  assert (config.mixer, config.n_layers, config.d_model) == (
      ("gla", "softmax_attn"), 2, 64)
  assert generate.model_config({"mixer": "rwkv6"}).mixer == "rwkv6"
  with pytest.raises(config_flags.FlagError, match=r"^--config.model.mixer / "
                     r"--config.model.n_layers: mixer has 2 names, which does "
                     r"not divide n_layers = 3$"):
    generate.model_config({"mixer": "gla,softmax_attn", "n_layers": "3"})


@pytest.mark.parametrize("name", ["mamba", "gla", "rwkv7",
                                  "forgetting_transformer"])
def test_live_reference(name, tmp_path):
  """Rebuilds the reference with the installed hf extra and compares."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  pytest.importorskip("fla")
  from experiments import make_hf_fixtures

  make_hf_fixtures.fla_cpu_reference()
  make_hf_fixtures.make_fixture(name, str(tmp_path))
  path = str(tmp_path / name)
  reference = np.load(os.path.join(path, "reference.npz"))
  lm, _, _ = convert.load_pretrained(path)
  full, decoded = _logits(lm, jnp.asarray(reference["tokens"], jnp.int32),
                          int(reference["prefill"]))
  assert rel_rms(full, reference["full"]) <= TOL
  assert rel_rms(decoded, reference["decode"]) <= TOL
