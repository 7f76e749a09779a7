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
from lin_attn_jax.data import (PackedRows, lra, sources, stdlib_corpus,
                               text_corpus, token_file_corpus, tokenizers)
from lin_attn_jax.data.corpus import BYTE_VOCAB
from lin_attn_jax.data.tasks import (ExampleRows, MaskedRows,
                                     SyntheticClassification)
from lin_attn_jax.models.lm import LM
from lin_attn_jax.train import Trainer
from lin_attn_jax.train.trainer import model_class

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


# Examples of a classification spec's splits when it does not say
# (LRA's ListOps: 96,000 / 2,000; Pathfinder's 200,000 images split 80 /
# 10 / 10). Examples are generated when read, so these cost nothing up
# front.
TRAIN_EXAMPLES = {"listops": 96_000, "pathfinder": 160_000,
                  "synthetic": 4096}
HELDOUT_EXAMPLES = 2000


def example_sets(experiment: Experiment):
  """``(train, held-out)`` labelled example sets of a "listops",
  "pathfinder" or "synthetic" data spec (``lin_attn_jax.data.lra``,
  ``data.tasks.SyntheticClassification``), as long as the rows
  (``train.seq_len``): ListOps expressions then have at most
  ``min(2000, seq_len + 1)`` tokens (LRA's ``max_length``) and at least a
  quarter of that (LRA's 500 of 2000) unless the spec says otherwise; the
  held-out set is the validation split (a second seed for the synthetic
  set). Raises ``FlagError`` naming the field that does not fit."""
  kind, _, options = parse_data(experiment.data)
  options = dict(options)
  examples = options.pop("examples", TRAIN_EXAMPLES[kind])
  seq_len, seed = experiment.train.seq_len, experiment.train.seed
  data_flag = f"{config_flags.PREFIX}.data"
  try:
    if kind == "listops":
      options.setdefault("max_length", min(2000, seq_len + 1))
      options.setdefault("min_length", options["max_length"] // 4)
      pair = [lra.ListOps(n, split=split, seed=seed, seq_len=seq_len,
                          **options)
              for n, split in ((examples, "train"),
                               (HELDOUT_EXAMPLES, "validation"))]
    elif kind == "pathfinder":
      pair = [lra.Pathfinder(n, split=split, seed=seed, **options)
              for n, split in ((examples, "train"),
                               (HELDOUT_EXAMPLES, "validation"))]
      if pair[0].seq_len != seq_len:
        raise FlagError(f"{config_flags.PREFIX}.train.seq_len",
                        f"Pathfinder images of {pair[0].config.resolution}"
                        f" x {pair[0].config.resolution} pixels are rows of "
                        f"{pair[0].seq_len} tokens, not {seq_len}")
    else:
      pair = [SyntheticClassification(n, seq_len=seq_len, seed=s, **options)
              for n, s in ((examples, seed), (HELDOUT_EXAMPLES, seed + 1))]
  except (ValueError, TypeError) as error:
    if isinstance(error, FlagError):
      raise
    raise FlagError(data_flag, str(error)) from None
  model = experiment.model
  need = (("num_classes", pair[0].num_classes, model.num_classes),
          ("vocab_size", pair[0].vocab_size, model.vocab_size))
  for name, theirs, mine in need:
    if mine < theirs:
      raise FlagError(f"{config_flags.PREFIX}.model.{name}",
                      f"{experiment.data} needs {name} >= {theirs}, the "
                      f"model has {mine}")
  if model.positions == "learned" and model.max_len < seq_len:
    raise FlagError(f"{config_flags.PREFIX}.model.max_len",
                    f"rows of {seq_len} tokens need max_len >= {seq_len} "
                    f"learned positions, the model has {model.max_len}")
  return pair


def load_corpora(experiment: Experiment):
  """``(train, held-out)`` corpora of ``experiment.data`` (for task
  "classify": ``example_sets``): jsonl and parquet
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
  if experiment.task == "classify":
    return example_sets(experiment)
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


def training_rows(experiment: Experiment, corpora) -> tuple:
  """``(train, held-out)`` row sources of ``corpora`` (``load_corpora``'s)
  for the task: ``PackedRows`` (lm), ``MaskedRows`` over them (mlm, the
  mask id the ``MaskedLM``'s ``vocab_size``), ``ExampleRows`` (classify).
  The training rows are shuffled by ``train.seed``, the held-out ones by
  0 (fixed batches)."""
  config = experiment.train
  if experiment.task == "classify":
    names = [f"{experiment.data} ({split})"
             for split in ("train", "held out")]
    return tuple(ExampleRows(s, seed=seed, name=name) for s, seed, name
                 in zip(corpora, (config.seed, 0), names))
  rows = [PackedRows(c, config.seq_len, seed=seed)
          for c, seed in zip(corpora, (config.seed, 0))]
  if experiment.task == "mlm":
    rows = [MaskedRows(r, vocab_size=experiment.model.vocab_size)
            for r in rows]
  return tuple(rows)


def token_bytes(experiment: Experiment) -> np.ndarray | None:
  """``[model.vocab_size]``: the UTF-8 bytes of text each id of the
  experiment's tokenizer stands for (``lin_attn_jax.data.token_bytes``),
  which turns the held-out loss into bits per byte; None when they are not
  known: token files or ArrayRecord shards with the byte tokenizer and a
  vocabulary other than 256 were tokenized by something else, and
  classification targets are labels."""
  if experiment.task == "classify":
    return None
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
  """Parameter count, layers, mixers and widths of the experiment's model
  (any class ``Trainer`` builds: ``trainer.model_class``)."""
  model = model_class(experiment.model)
  abstract = nnx.eval_shape(lambda: model(experiment.model,
                                          rngs=nnx.Rngs(0)))
  count = sum(int(np.prod(x.shape)) for x in
              jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  names = experiment.model.layer_mixers
  mixers = ", ".join(f"{n} x{names.count(n)}" for n in dict.fromkeys(names))
  kind = "" if model is LM else f"{model.__name__}, "
  return (f"{kind}{count / 1e6:.2f}M parameters: {experiment.model.n_layers} "
          f"layers ({mixers}), d_model {experiment.model.d_model}, "
          f"{experiment.model.n_heads} heads")
