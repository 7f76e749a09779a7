"""The files of a work directory, and starting points for new runs.

A training work directory (``python -m experiments.train --workdir=DIR``) holds

- ``experiment.json``: the run's settings (``configs.Experiment``), read
  back when the run resumes;
- ``checkpoints/<step>/``: orbax checkpoints of the train state (or
  ``--checkpoint_dir``, e.g. a ``gs://`` path);
- ``metrics.jsonl``, ``loss.png``, ``tensorboard/``: what it measured;
- ``config.json`` and ``params/``: the final model in the format of
  ``python -m experiments.convert`` (``LMConfig.to_dict`` and
  ``models.checkpoints.save_params``), with the run's tokenizer files
  (none for bytes), which ``experiments.evaluate`` and
  ``experiments.generate`` read.

``--init_from`` takes either kind of directory: a converted (params-only)
one, or a training one (its newest checkpoint's parameters).
"""

from __future__ import annotations

import json
import os
import shutil

import jax
from flax import nnx

from lin_attn_jax.data import tokenizers
from lin_attn_jax.models.checkpoints import (STORED_VARIABLES, load_variables,
                                             save_params)
from lin_attn_jax.models.lm import LMConfig
from lin_attn_jax.train import Checkpointer, Trainer
from lin_attn_jax.train.loop import CHECKPOINT_DIR

EXPERIMENT_FILE = "experiment.json"
MODEL_CONFIG_FILE = "config.json"
PARAMS_DIR = "params"


def is_url(path: str) -> bool:
  return "://" in path


def join(base: str, *parts: str) -> str:
  """``os.path.join`` that keeps ``gs://`` URLs intact."""
  if is_url(base):
    return "/".join([base.rstrip("/"), *parts])
  return os.path.join(base, *parts)


def checkpoint_dir(workdir: str, override: str | None = None) -> str:
  return override or join(workdir, CHECKPOINT_DIR)


def read_json(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def write_json(path: str, values: dict) -> None:
  """Written by process 0, atomically (a rename)."""
  if jax.process_index() != 0:
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  partial = f"{path}.partial"
  with open(partial, "w") as f:
    json.dump(values, f, indent=2)
  os.replace(partial, path)


def latest_checkpoint(directory: str) -> int | None:
  """The newest complete checkpoint's step under ``directory``, or None."""
  if not is_url(directory) and not os.path.isdir(directory):
    return None
  checkpointer = Checkpointer(directory, async_save=False)
  try:
    return checkpointer.latest_step()
  finally:
    checkpointer.close()


def stored_model_config(directory: str, step: int) -> LMConfig:
  """The model config stored with the checkpoint at ``step``."""
  checkpointer = Checkpointer(directory, async_save=False)
  try:
    return LMConfig.from_dict(checkpointer.stored_config(step)["model"])
  finally:
    checkpointer.close()


def source_kind(path: str) -> str:
  """``"params"`` (``config.json`` + ``params/``, experiments.convert)
  or ``"checkpoint"`` (a training work directory)."""
  if os.path.exists(join(path, MODEL_CONFIG_FILE)) and os.path.isdir(
      join(path, PARAMS_DIR)):
    return "params"
  if latest_checkpoint(join(path, CHECKPOINT_DIR)) is not None:
    return "checkpoint"
  raise ValueError(f"{path} holds neither {MODEL_CONFIG_FILE} with "
                   f"{PARAMS_DIR}/ (experiments.convert) nor a checkpoint "
                   f"in {CHECKPOINT_DIR}/ (experiments.train)")


def source_model_config(path: str) -> LMConfig:
  """The model of an ``--init_from`` directory."""
  if source_kind(path) == "params":
    return LMConfig.from_dict(read_json(join(path, MODEL_CONFIG_FILE)))
  directory = join(path, CHECKPOINT_DIR)
  return stored_model_config(directory, latest_checkpoint(directory))


def source_params(path: str, trainer: Trainer) -> tuple[nnx.State, str]:
  """The parameters of an ``--init_from`` directory, placed as
  ``trainer``'s, and a description of where they came from."""
  params, _, where = source_state(path, trainer)
  return params, where


def source_state(path: str, trainer: Trainer
                 ) -> tuple[nnx.State, nnx.State, str]:
  """``(params, rest, where)`` of an ``--init_from`` directory: its
  parameters placed as ``trainer``'s, the non-parameter state of a fresh
  ``trainer.init()`` with the stored variables (routers' selection biases)
  put in, and where they came from."""
  fresh = trainer.init()
  if source_kind(path) == "params":
    stored = nnx.filter_state(fresh.rest, STORED_VARIABLES)
    params, variables = load_variables(
        join(path, PARAMS_DIR), trainer.abstract_state.params, stored)
    rest = nnx.merge_state(fresh.rest, variables)
    return params, rest, join(path, PARAMS_DIR)
  state, where = restore_newest(join(path, CHECKPOINT_DIR), trainer)
  return state.params, state.rest, where


def restore_newest(directory: str, trainer: Trainer):
  """``(state, where)``: the newest readable checkpoint under
  ``directory``, restored onto ``trainer``'s mesh, and its path."""
  checkpointer = Checkpointer(directory, async_save=False)
  try:
    restored = trainer.restore(checkpointer)
  finally:
    checkpointer.close()
  if restored is None:
    raise ValueError(f"no readable checkpoint in {directory}")
  state, _, step = restored
  return state, join(directory, str(step))


def checkpoint_params(directory: str, trainer: Trainer
                      ) -> tuple[nnx.State, str]:
  """The newest checkpoint's parameters, restored onto ``trainer``'s
  mesh."""
  state, where = restore_newest(directory, trainer)
  return state.params, where


def export_model(workdir: str, trainer: Trainer, state) -> str:
  """Writes ``config.json`` and ``params/`` (the format of
  experiments.convert) of ``state``'s model; returns the params path."""
  write_json(join(workdir, MODEL_CONFIG_FILE), trainer.model_config.to_dict())
  path = join(workdir, PARAMS_DIR)
  with jax.set_mesh(trainer.mesh):
    save_params(path, trainer.model(state), force=True)
  return path


def export_tokenizer(name: str, directory: str) -> None:
  """Copies the tokenizer ``name`` (``Experiment.tokenizer``: ``"bytes"``,
  a file or a directory) into ``directory``, so that
  ``tokenizers.load_tokenizer(directory)`` reads the same tokenizer: its
  model file (a ``tokenizer.json`` under that name) and a
  ``tokenizer_config.json``, the source's with the special ids that
  ``load_tokenizer`` found written in. Nothing for bytes, nothing from
  processes other than 0."""
  if name == "bytes" or jax.process_index() != 0:
    return
  tokenizer = tokenizers.load_tokenizer(name)
  path = os.path.expanduser(name)
  source = path if os.path.isdir(path) else os.path.dirname(path)
  model = (tokenizers.tokenizer_files(path)[0] if os.path.isdir(path)
           else path)
  target = (tokenizers.HF_FILE if model.endswith(".json")
            else os.path.basename(model))
  if os.path.abspath(source) == os.path.abspath(directory):
    return
  os.makedirs(directory, exist_ok=True)
  shutil.copy(model, os.path.join(directory, target))
  special = read_json(os.path.join(source, "special_tokens_map.json"))
  if special is not None:
    write_json(os.path.join(directory, "special_tokens_map.json"), special)
  config = read_json(os.path.join(source,
                                  tokenizers.SPECIAL_TOKEN_FILES[0])) or {}
  for key in ("bos", "eos", "pad"):
    value = getattr(tokenizer, f"{key}_id")
    if value is not None:
      config[f"{key}_token_id"] = value
  write_json(os.path.join(directory, tokenizers.SPECIAL_TOKEN_FILES[0]),
             config)
