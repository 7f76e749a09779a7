"""Turning flag values into a run: settings, data, mesh and trainer, and
the greedy sampler, with bad values reported as ``FlagError`` naming the
flag. No absl flags are defined here (tests and other scripts import it).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.configs.base import Experiment
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import stdlib_corpus, text_corpus, token_file_corpus
from lin_attn_jax.data.corpus import BYTE_VOCAB
from lin_attn_jax.models.lm import LM
from lin_attn_jax.train import Trainer

# Flag -> LMConfig field.
MODEL_FLAGS = ("mixer", "d_model", "n_layers", "n_heads", "vocab_size",
               "mixer_options", "dtype", "remat")
# Model fields a resumed run (or one started from --init_from) may change.
FREE_MODEL_FLAGS = ("dtype", "remat")
# Flag -> TrainConfig field.
TRAIN_FLAGS = ("steps", "batch_size", "seq_len", "grad_accum",
               "learning_rate", "warmup_steps", "seed", "checkpoint_every")
# Flag -> Experiment field.
RUN_FLAGS = ("mesh", "rules", "data", "eval_every", "eval_batches",
             "sample_every", "sample_tokens", "prompt", "log_every")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class FlagError(ValueError):
  """A bad flag value: ``--flag: what is wrong``."""

  def __init__(self, flag: str, message: str):
    self.flag = flag
    super().__init__(f"--{flag}: {message}")


def _model_value(name: str, value, model):
  if name == "mixer":
    names = tuple(str(v).strip() for v in value)
    return names[0] if len(names) == 1 else names
  if name == "dtype":
    if value not in DTYPES:
      raise FlagError(name, f"must be one of {sorted(DTYPES)}, got {value!r}")
    return DTYPES[value]
  if name == "mixer_options":
    try:
      options = json.loads(value)
    except json.JSONDecodeError as error:
      raise FlagError(name, f"is not JSON ({error.msg}): {value!r}") from None
    if not isinstance(options, dict) or not all(
        isinstance(v, dict) for v in options.values()):
      raise FlagError(name, 'must map mixer names to option objects, e.g. '
                      '{"gla": {"chunk_size": 32}}')
    merged = {n: dict(kw) for n, kw in model.mixer_options}
    for mixer, kw in options.items():
      merged[mixer] = {**merged.get(mixer, {}), **kw}
    return merged
  return value


def _blame(error: ValueError, names) -> str:
  """The flag (of ``names``) that a config's ``ValueError`` is about."""
  text = str(error)
  for name in names:
    if name in text:
      return name
  return "/--".join(names)


def resolve(base: Experiment, values: dict, fixed_model=None,
            fixed_by: str = "") -> Experiment:
  """``base`` with the flag ``values`` applied.

  ``fixed_model`` (a resumed run's, or ``--init_from``'s) replaces the
  model; model flags other than dtype and remat must then agree with it.

  Raises:
    FlagError: naming the flag whose value is bad.
  """
  model = base.model if fixed_model is None else fixed_model
  changes = {}
  for name in MODEL_FLAGS:
    if name not in values:
      continue
    value = _model_value(name, values[name], model)
    if fixed_model is not None and name not in FREE_MODEL_FLAGS:
      current = getattr(fixed_model, name)
      if name == "mixer_options":
        value = dataclasses.replace(fixed_model,
                                    mixer_options=value).mixer_options
      if value != current:
        raise FlagError(name, f"{fixed_by} fixes the model ({name} = "
                        f"{fixed_model.to_dict()[name]!r}); drop the flag")
      continue
    changes[name] = value
  try:
    model = dataclasses.replace(model, **changes)
  except ValueError as error:
    raise FlagError(_blame(error, list(changes)), str(error)) from None
  train_changes = {name: values[name] for name in TRAIN_FLAGS
                   if name in values}
  try:
    train = dataclasses.replace(base.train, **train_changes)
  except ValueError as error:
    raise FlagError(_blame(error, list(train_changes)), str(error)) from None
  run = {name: values[name] for name in RUN_FLAGS if name in values}
  experiment = dataclasses.replace(base, model=model, train=train, **run)
  check_run_settings(experiment)
  return experiment


def check_run_settings(experiment: Experiment) -> None:
  if experiment.rules not in shd.PRESETS:
    raise FlagError("rules", f"unknown rules {experiment.rules!r}; presets: "
                    f"{', '.join(shd.PRESETS)}")
  parse_data(experiment.data)
  for name, least in (("eval_every", 0), ("sample_every", 0),
                      ("eval_batches", 1), ("sample_tokens", 1),
                      ("log_every", 1)):
    value = getattr(experiment, name)
    if not isinstance(value, int) or value < least:
      raise FlagError(name, f"must be an int >= {least}, got {value!r}")


def parse_data(spec: str) -> tuple[str, object, dict]:
  """``(kind, what, options)`` of a ``--data`` value."""
  kind, _, rest = spec.partition(":")
  if kind == "stdlib" and not rest:
    return "stdlib", None, {}
  if kind == "text" and rest:
    return "text", [p for p in rest.split(",") if p], {}
  if kind == "tokens" and rest:
    path, *pairs = rest.split(",")
    options = {}
    for pair in pairs:
      key, sep, value = pair.partition("=")
      if not sep or key not in ("dtype", "eos_id", "doc_len"):
        raise FlagError("data", f"token file option {pair!r} is not "
                        "dtype=..., eos_id=N or doc_len=N")
      options[key] = value if key == "dtype" else int(value)
    return "tokens", path, options
  raise FlagError("data", "must be stdlib, text:GLOB[,GLOB...] or "
                  f"tokens:PATH[,dtype=uint16][,eos_id=N]; got {spec!r}")


def load_corpora(experiment: Experiment):
  """``(train, held-out)`` corpora of ``--data``."""
  kind, what, options = parse_data(experiment.data)
  fraction = experiment.heldout_fraction
  try:
    if kind == "stdlib":
      pair = [stdlib_corpus(s, fraction) for s in ("train", "heldout")]
    elif kind == "text":
      pair = [text_corpus(what, s, fraction) for s in ("train", "heldout")]
    else:
      pair = [token_file_corpus(what, split=s, heldout_fraction=fraction,
                                **options) for s in ("train", "heldout")]
  except (ValueError, OSError) as error:
    raise FlagError("data", str(error)) from None
  vocab = max(c.vocab_size for c in pair)
  if vocab > experiment.model.vocab_size:
    raise FlagError("vocab_size", f"the data has token ids up to {vocab - 1}"
                    f", the model {experiment.model.vocab_size} ids")
  return pair


def build_trainer(experiment: Experiment) -> Trainer:
  """The mesh and the trainer; bad shapes raise ``FlagError``."""
  try:
    mesh = shd.make_mesh(experiment.mesh)
  except ValueError as error:
    raise FlagError("mesh", str(error)) from None
  try:
    return Trainer(experiment.model, experiment.train, mesh=mesh,
                   rules=experiment.rules)
  except ValueError as error:
    text = str(error)
    for prefix, flag in (("batch_size", "batch_size"), ("seq_len", "seq_len"),
                         ("n_heads", "n_heads"), ("d_model", "d_model"),
                         ("mlp width", "d_model"),
                         ("vocab_size", "vocab_size")):
      if text.startswith(prefix):
        raise FlagError(flag, text) from None
    raise FlagError("mesh", text) from None


def host_array(array) -> np.ndarray:
  if array.is_fully_addressable:
    return np.asarray(array)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(array, tiled=True))


class Sampler:
  """Greedy continuations of the prompt (one compiled program)."""

  def __init__(self, trainer: Trainer, experiment: Experiment):
    self.trainer = trainer
    self.bytes = experiment.model.vocab_size == BYTE_VOCAB
    prompt = (list(experiment.prompt.encode("utf-8")) if self.bytes
              else [0]) or [0]
    self.prompt = jnp.asarray([prompt], jnp.int32)
    self.tokens = experiment.sample_tokens

  def __call__(self, params, rest) -> str:
    with jax.set_mesh(self.trainer.mesh):
      lm = nnx.merge(self.trainer.graphdef, params, rest)
      out = lm.generate(self.prompt, self.tokens)
    tokens = host_array(out)[0].tolist()
    if self.bytes:
      return bytes(tokens).decode("utf-8", "replace")
    return " ".join(str(t) for t in tokens)


def indented(text: str) -> str:
  return "\n".join("  | " + line for line in text.splitlines() or [""])


def describe_model(experiment: Experiment) -> str:
  abstract = nnx.eval_shape(lambda: LM(experiment.model, rngs=nnx.Rngs(0)))
  count = sum(int(np.prod(x.shape)) for x in
              jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  names = experiment.model.layer_mixers
  mixers = ", ".join(f"{n} x{names.count(n)}" for n in dict.fromkeys(names))
  return (f"{count / 1e6:.2f}M parameters: {experiment.model.n_layers} "
          f"layers ({mixers}), d_model {experiment.model.d_model}, "
          f"{experiment.model.n_heads} heads")
