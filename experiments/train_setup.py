"""Turning a preset and its dotted overrides into a run: settings, data,
mesh and trainer, and the greedy sampler, with bad values reported as
``FlagError`` naming the field. No absl flags are defined here (tests and
other scripts import it).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import config_flags
from experiments.config_flags import FlagError
from experiments.configs.base import Experiment, parse_data
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import (sources, stdlib_corpus, text_corpus,
                               token_file_corpus, tokenizers)
from lin_attn_jax.data.corpus import BYTE_VOCAB
from lin_attn_jax.models.lm import LM
from lin_attn_jax.train import Trainer

# Model fields that a resumed run (or one started from --init_from) may
# change: the others are fixed by the checkpoint's (or the source's) model.
FREE_MODEL_FIELDS = ("dtype", "remat")
MESH = f"{config_flags.PREFIX}.mesh"


def resolve(base: Experiment, overrides: Mapping[str, str | None],
            fixed_model=None, fixed_by: str = "") -> Experiment:
  """``base`` with the dotted ``overrides`` (``{"model.d_model": "256"}``,
  the ``--config.<path>=<value>`` flags) applied.

  ``fixed_model`` (a resumed run's, or ``--init_from``'s) replaces the
  model; overrides of model fields other than ``FREE_MODEL_FIELDS`` must
  then agree with it.

  Raises:
    FlagError: naming the dotted field whose value is bad.
  """
  if fixed_model is not None:
    base = dataclasses.replace(base, model=fixed_model)
  experiment = config_flags.apply_overrides(base, overrides)
  if fixed_model is None:
    return experiment
  before, after = fixed_model.to_dict(), experiment.model.to_dict()
  for path in overrides:
    section, _, field = path.partition(".")
    name = field.split(".")[0]
    if section != "model" or name in FREE_MODEL_FIELDS:
      continue
    if after[name] != before[name]:
      raise FlagError(f"{config_flags.PREFIX}.{path}",
                      f"{fixed_by} fixes the model ({name} = "
                      f"{before[name]!r}); drop the flag")
  return experiment


def load_tokenizer(experiment: Experiment) -> tokenizers.Tokenizer:
  """The tokenizer of ``experiment.tokenizer``, checked against the model's
  vocabulary (``tokenizers.check_vocab``)."""
  try:
    tokenizer = tokenizers.load_tokenizer(experiment.tokenizer)
  except (ValueError, ImportError) as error:
    raise FlagError(f"{config_flags.PREFIX}.tokenizer", str(error)) from None
  try:
    tokenizers.check_vocab(tokenizer, experiment.model.vocab_size)
  except ValueError as error:
    raise FlagError(f"{config_flags.PREFIX}.model.vocab_size",
                    str(error)) from None
  return tokenizer


def load_corpora(experiment: Experiment):
  """``(train, held-out)`` corpora of ``experiment.data``: jsonl and parquet
  text tokenized with ``experiment.tokenizer`` (``load_tokenizer``);
  ``stdlib`` and ``text:`` data are bytes, so they take the byte tokenizer
  only, and token files and ArrayRecord shards are tokenized already."""
  tokenizer = load_tokenizer(experiment)
  kind, what, options = parse_data(experiment.data)
  if (kind in ("stdlib", "text")
      and not isinstance(tokenizer, tokenizers.ByteTokenizer)):
    raise FlagError(
        f"{config_flags.PREFIX}.tokenizer",
        f"{kind} data is read as UTF-8 bytes; use jsonl: or parquet: data "
        f"(or python -m experiments.tokenize) with "
        f"tokenizer {experiment.tokenizer!r}")
  fraction = experiment.heldout_fraction
  try:
    if kind == "stdlib":
      pair = [stdlib_corpus(s, fraction) for s in ("train", "heldout")]
    elif kind == "text":
      pair = [text_corpus(what, s, fraction) for s in ("train", "heldout")]
    elif kind == "tokens":
      pair = [token_file_corpus(what, split=s, heldout_fraction=fraction,
                                **options) for s in ("train", "heldout")]
    elif kind == "arrayrecord":
      pair = [sources.array_record_corpus(
          what, split=s, heldout_fraction=fraction, **options)
              for s in ("train", "heldout")]
    else:
      read = (sources.jsonl_corpus if kind == "jsonl"
              else sources.parquet_corpus)
      pair = [read(what, tokenizer, split=s,
                   heldout_fraction=fraction, **options)
              for s in ("train", "heldout")]
  except (ValueError, OSError, ImportError) as error:
    raise FlagError(f"{config_flags.PREFIX}.data", str(error)) from None
  vocab = max(c.vocab_size for c in pair)
  if vocab > experiment.model.vocab_size:
    raise FlagError(f"{config_flags.PREFIX}.model.vocab_size",
                    f"the data has token ids up to {vocab - 1}"
                    f", the model {experiment.model.vocab_size} ids")
  return pair


def token_bytes(experiment: Experiment) -> np.ndarray | None:
  """``[model.vocab_size]``: the UTF-8 bytes of text each id of the
  experiment's tokenizer stands for (``lin_attn_jax.data.token_bytes``),
  which turns the held-out loss into bits per byte; None when they are not
  known: token files or ArrayRecord shards with the byte tokenizer and a
  vocabulary other than 256 were tokenized by something else."""
  tokenizer = load_tokenizer(experiment)
  kind = parse_data(experiment.data)[0]
  if (isinstance(tokenizer, tokenizers.ByteTokenizer)
      and kind in ("tokens", "arrayrecord")
      and experiment.model.vocab_size != BYTE_VOCAB):
    return None
  return tokenizers.token_bytes(tokenizer, experiment.model.vocab_size)


def build_trainer(experiment: Experiment) -> Trainer:
  """The mesh and the trainer. A mesh that the devices cannot form, or
  that does not divide the batch or the model's widths, raises
  ``FlagError`` naming ``config.mesh`` (the message names the widths)."""
  try:
    mesh = shd.make_mesh(experiment.mesh)
  except ValueError as error:
    raise FlagError(MESH, str(error)) from None
  try:
    return Trainer(experiment.model, experiment.train, mesh=mesh,
                   rules=experiment.rules)
  except ValueError as error:
    raise FlagError(MESH, f"the batch or the model does not split over the "
                    f"mesh: {error}") from None


def host_array(array) -> np.ndarray:
  if array.is_fully_addressable:
    return np.asarray(array)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(array, tiled=True))


class Sampler:
  """Greedy continuations of the prompt (one compiled program)."""

  def __init__(self, trainer: Trainer, experiment: Experiment):
    self.trainer = trainer
    self.tokenizer = None
    if experiment.tokenizer != "bytes":
      self.tokenizer = load_tokenizer(experiment)
    self.bytes = experiment.model.vocab_size == BYTE_VOCAB
    if self.tokenizer is not None:
      prompt = self.tokenizer.encode(experiment.prompt)
    else:
      prompt = list(experiment.prompt.encode("utf-8")) if self.bytes else [0]
    self.prompt = jnp.asarray([prompt or [0]], jnp.int32)
    self.tokens = experiment.sample_tokens

  def __call__(self, params, rest) -> str:
    with jax.set_mesh(self.trainer.mesh):
      lm = nnx.merge(self.trainer.graphdef, params, rest)
      out = lm.generate(self.prompt, self.tokens)
    tokens = host_array(out)[0].tolist()
    if self.tokenizer is not None:
      vocab = self.tokenizer.vocab_size
      return self.tokenizer.decode([t for t in tokens if t < vocab])
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
