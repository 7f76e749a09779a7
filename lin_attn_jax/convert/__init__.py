"""Loading HuggingFace-format checkpoints into the project's LM, and back.

A checkpoint directory holds ``config.json`` and safetensors weights
(``model.safetensors``, or shards named by ``model.safetensors.index.json``);
nothing is downloaded. Supported ``model_type`` values: ``mamba``,
``mamba2``, ``recurrent_gemma``, ``xlstm`` (xLSTM-7B: mLSTM layers), the
linear-attention hybrids with mixture-of-experts MLPs ``qwen3_next``,
``kimi_linear`` and ``minimax`` (``linear_hybrids.py``) and the SSM hybrids
``falcon_h1``, ``nemotron_h``, ``granitemoehybrid``, ``jamba`` and ``lfm2``
(``ssm_hybrids.py``) from transformers, and
flash-linear-attention's ``gla``, ``delta_net``, ``gated_deltanet``,
``rwkv6``, ``rwkv7``, ``stickbreaking_attn``, ``forgetting_transformer``,
``nsa``, ``path_attn``, ``gated_deltaproduct``, ``comba``, ``mamba3``,
``log_linear_mamba2`` and ``mesa_net``.

  >>> lm, config, hf_config = load_pretrained("/path/to/checkpoint")
  >>> tokenizer = checkpoint_tokenizer("/path/to/checkpoint")  # or None
  >>> logits = lm(tokens)
  >>> export_pretrained(lm, hf_config, "/path/to/new_checkpoint")

Every tensor is checked (name, shape, floating dtype) against the shapes the
config implies before anything is converted; a bad checkpoint raises
``ValueError`` naming the tensor and both shapes.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax import sharding as shd
from lin_attn_jax.convert import architectures, core, safetensors_io, sharded
from lin_attn_jax.data import tokenizers
from lin_attn_jax.models.lm import LM, LMConfig

SUPPORTED = tuple(sorted(architectures.ARCHITECTURES))


def _architecture(hf: dict):
  model_type = hf.get("model_type")
  if model_type not in architectures.ARCHITECTURES:
    raise ValueError(f"config.json has model_type = {model_type!r}; "
                     f"supported: {list(SUPPORTED)}")
  return architectures.ARCHITECTURES[model_type]


def plan(hf: dict):
  """``(LMConfig, entries, abstract params)`` of a HF config dict."""
  make_config, make_entries = _architecture(hf)
  config = make_config(hf)
  entries = make_entries(hf, config)
  abstract = core.abstract_params(config)
  core.check_coverage(entries, abstract)
  return config, entries, abstract


def expected_tensors(hf: dict) -> dict[str, tuple]:
  """The tensor names and shapes a HF config implies."""
  _, entries, abstract = plan(hf)
  return core.expected_tensors(entries, abstract)


def convert_checkpoint(path: str):
  """``(LMConfig, params, hf_config)`` of the checkpoint at ``path``;
  ``params`` is the LM's parameters as a pure dict of float32 arrays."""
  hf = core.read_config(path)
  config, entries, abstract = plan(hf)
  tensors = safetensors_io.checkpoint_tensors(path)
  expected = core.expected_tensors(entries, abstract)
  core.check_tensors(tensors, expected, architectures.ignored_tensor)
  arrays = {name: tensors[name].read() for name in expected}
  params = core.import_params(entries, arrays, abstract)
  return config, params, hf


def load_pretrained(path: str, *, param_dtype=None,
                    with_tokenizer: bool = False):
  """``(LM, LMConfig, hf_config)`` from the checkpoint at ``path``, and
  its tokenizer as a fourth element with ``with_tokenizer``.

  Tensors of any floating dtype (float32, bfloat16, float16) are converted
  in float32; ``param_dtype`` (e.g. ``jnp.bfloat16``; default the
  config's, float32) casts the result, so a bfloat16 checkpoint loads into
  float32 or bfloat16 parameters.
  The tokenizer is ``checkpoint_tokenizer(path)``: None when the
  checkpoint ships none.
  """
  config, params, hf = convert_checkpoint(path)
  lm = core.build_lm(config, params, param_dtype)
  if with_tokenizer:
    return lm, lm.config, hf, checkpoint_tokenizer(path)
  return lm, lm.config, hf


def load_sharded(path: str, mesh: jax.sharding.Mesh,
                 rules: str | shd.Rules = "fsdp", *, param_dtype=None):
  """``(LM, LMConfig, hf_config)`` from the checkpoint at ``path``, every
  parameter created directly in its sharded layout on ``mesh`` (the
  ``NamedSharding`` that ``sharding.state_shardings`` gives it under
  ``rules``).

  Each process reads, through memory maps of the safetensors files, only
  the slices of the tensors that its devices hold; no tensor is
  materialised whole on one host or device (see ``convert.sharded`` for
  how each conversion entry is sliced). The values equal
  ``load_pretrained``'s, cast to ``param_dtype`` (default the config's,
  float32). Tensors are checked as by ``load_pretrained`` before anything
  is read.
  """
  hf = core.read_config(path)
  config, entries, abstract = plan(hf)
  tensors = safetensors_io.checkpoint_tensors(path)
  core.check_tensors(tensors, core.expected_tensors(entries, abstract),
                     architectures.ignored_tensor)
  if param_dtype is not None:
    config = dataclasses.replace(config, param_dtype=param_dtype)
  model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  shardings = nnx.to_pure_dict(shd.state_shardings(
      nnx.state(model, core.LOADED), mesh, rules))
  loaded = sharded.sharded_params(entries, tensors, abstract, shardings,
                                  jnp.dtype(config.param_dtype))
  graphdef, state = nnx.split(model)
  nnx.replace_by_pure_dict(state, loaded.params)
  return nnx.merge(graphdef, state), config, hf


def checkpoint_tokenizer(path: str) -> tokenizers.Tokenizer | None:
  """The tokenizer of the checkpoint directory ``path`` (``tokenizer.json``
  or a SentencePiece ``.model``, special ids from the JSON files beside
  them, ``config.json`` included), or None when it has none. A tokenizer
  with more ids than the checkpoint's ``vocab_size`` raises ``ValueError``
  (``tokenizers.check_vocab``)."""
  if not tokenizers.tokenizer_files(path):
    return None
  tokenizer = tokenizers.load_tokenizer(path)
  vocab_size = core.read_config(path).get("vocab_size")
  if vocab_size is not None:
    tokenizers.check_vocab(tokenizer, vocab_size)
  return tokenizer


def export_pretrained(lm: LM, hf: dict, path: str, *,
                      dtype=np.float32) -> None:
  """Writes ``lm`` as a HF checkpoint (``config.json`` = ``hf`` and
  ``model.safetensors`` of ``dtype`` tensors: float32, or e.g.
  ``jnp.bfloat16``) into the new directory ``path``. The tensors are
  computed in float32 and rounded to ``dtype`` once, so a bfloat16
  checkpoint loaded into float32 parameters exports back to the same bits
  (entries whose transform is not exact in float32, such as a zero-centred
  norm's ``1 + w``, can differ in the last bit).

  ``hf`` must describe ``lm`` (the config it was loaded with). Norm weights
  that the HF layer shares over heads must be equal over heads.
  """
  config, entries, abstract = plan(hf)
  # The parameter and compute dtypes are the loader's choice, not the
  # checkpoint's.
  ours = dataclasses.replace(lm.config, dtype=config.dtype,
                             param_dtype=config.param_dtype)
  if config != ours:
    raise ValueError("the HF config describes a different LM config than "
                     f"the model's: {config} vs {lm.config}")
  params = core.loaded_state(lm)
  tensors = core.export_tensors(entries, params)
  for entry in entries:
    if entry.to_hf.__qualname__.startswith("head_shared"):
      for p in entry.ours:
        value = np.asarray(core._get(params, p))
        heads = value.reshape(-1, tensors[entry.hf[0]].shape[-1])
        if not np.all(heads == heads[:1]):
          raise ValueError(f"{p} differs between heads; {entry.hf[0]} holds "
                           "one weight for every head")
  dtype = np.dtype(dtype)
  if dtype.name not in ("float32", "bfloat16", "float16"):
    raise ValueError(f"dtype {dtype} cannot be exported; use float32, "
                     "bfloat16 or float16")
  if os.path.exists(path):
    raise ValueError(f"{path} exists; export writes a new directory")
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
  safetensors_io.write_file(
      os.path.join(path, safetensors_io.SINGLE_FILE),
      {name: np.asarray(jax.device_get(v), np.float32).astype(dtype)
       for name, v in tensors.items()})


__all__ = ["SUPPORTED", "checkpoint_tokenizer", "convert_checkpoint",
           "expected_tensors",
           "export_pretrained", "load_pretrained", "load_sharded", "plan"]
