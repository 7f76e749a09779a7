"""What a training run is: the model, the optimizer and batch, the mesh,
the data and how often to evaluate and sample.

A preset is a module of this package with a ``CONFIG``; ``python -m
experiments.train --config=NAME`` picks one and ``--config.<field>=VALUE``
flags (``experiments/config_flags.py``) override its fields by dotted name,
e.g. ``--config.model.d_model=256`` or ``--config.eval_every=50``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from experiments import config_flags
from lin_attn_jax import sharding as shd
from lin_attn_jax.models.encoder import ClassifierConfig, MLMConfig
from lin_attn_jax.models.lm import LMConfig
from lin_attn_jax.train import TrainConfig

# Options of a "tokens:PATH,..." data spec.
TOKEN_FILE_OPTIONS = ("dtype", "eos_id", "doc_len")
# Options of the record specs "jsonl:GLOB,...", "parquet:GLOB,...",
# "arrayrecord:GLOB,..." (lin_attn_jax/data/sources.py).
RECORD_OPTIONS = {
    "jsonl": ("text_field", "skip_bad_records"),
    "parquet": ("text_field", "skip_bad_records"),
    "arrayrecord": ("dtype", "vocab_size", "skip_bad_records"),
}
# Options of the classification data specs "listops[:key=value,...]",
# "pathfinder[:...]" and "synthetic[:...]" (docs/training.md).
EXAMPLE_OPTIONS = {
    "listops": ("examples", "max_length", "min_length", "max_depth",
                "max_args"),
    "pathfinder": ("examples", "resolution", "level"),
    "synthetic": ("examples", "num_classes", "vocab_size", "signal"),
}
_INT_OPTIONS = ("eos_id", "doc_len", "vocab_size", "examples", "max_length",
                "min_length", "max_depth", "max_args", "resolution",
                "num_classes")
# What a run trains, and the class of its model config: a causal LM
# (next-token loss), a sequence classifier over labelled examples, a masked
# LM (BERT's objective over the corpus).
TASKS = {"lm": LMConfig, "classify": ClassifierConfig, "mlm": MLMConfig}
# Compute dtypes a run may use (parameters and states stay float32).
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One training run's settings (everything but where it writes)."""

  # Shape and mixers of the model: an LMConfig, or the subclass of the
  # task (TASKS).
  model: LMConfig
  # Optimizer, schedule, batch, steps and checkpoint cadence.
  train: TrainConfig
  # Mesh for sharding.make_mesh: axis=size pairs over data, fsdp, tensor,
  # sequence; one size may be -1 (the devices left).
  mesh: str = "fsdp=-1"
  # Sharding rules preset: "dp", "fsdp" or "fsdp_tp".
  rules: str = "fsdp"
  # Training text: "stdlib" (the Python standard library's source),
  # "text:GLOB[,GLOB...]" (files, one document each, byte tokens) or
  # "tokens:PATH[,dtype=uint16][,eos_id=N]" (a pre-tokenized .npy / .bin),
  # "jsonl:GLOB[,GLOB...][,text_field=text]" (a document per line),
  # "parquet:GLOB[,GLOB...][,text_field=text]" (a document per row) or
  # "arrayrecord:GLOB[,GLOB...][,dtype=uint32]" (token records); the record
  # specs also take skip_bad_records=true (docs/training.md). Task
  # "classify" reads labelled examples instead: "listops[:examples=N,
  # max_length=M,...]", "pathfinder[:resolution=32,level=hard,examples=N]"
  # or "synthetic[:examples=N,num_classes=4,vocab_size=16,signal=0.3]".
  data: str = "stdlib"
  # Tokenizer of the text: "bytes" (UTF-8 bytes, vocabulary 256) or a path
  # to a tokenizer.json, a SentencePiece .model or a directory holding one
  # (lin_attn_jax.data.load_tokenizer); model.vocab_size must be at least
  # its vocabulary (larger is padding).
  tokenizer: str = "bytes"
  # Fraction of the documents held out for evaluation (by a hash of names).
  heldout_fraction: float = 0.02
  # Held-out loss every this many steps (0: only at the end) ...
  eval_every: int = 100
  # ... over this many fixed held-out batches.
  eval_batches: int = 4
  # A greedy sample every this many steps (0: only at the end) ...
  sample_every: int = 0
  # ... of this many new tokens ...
  sample_tokens: int = 64
  # ... continuing this prompt (encoded with the tokenizer; with "bytes",
  # byte-token models only).
  prompt: str = "def "
  # A progress line every this many steps when stdout is not a terminal.
  log_every: int = 10
  # "lm", "classify" or "mlm" (TASKS): picks the model config's class, the
  # rows (packed text; labelled examples of a "listops", "pathfinder" or
  # "synthetic" data spec; masked packed text) and whether to sample.
  task: str = "lm"

  # Overrides of these go first: the task decides the model's fields.
  leading_fields = ("task",)

  def __post_init__(self):
    if jnp.dtype(self.model.dtype).name not in COMPUTE_DTYPES:
      raise ValueError(f"model.dtype must be one of {COMPUTE_DTYPES}, got "
                       f"{jnp.dtype(self.model.dtype).name!r}")
    if self.rules not in shd.PRESETS:
      raise ValueError(f"unknown rules {self.rules!r}; presets: "
                       f"{', '.join(shd.PRESETS)}")
    if self.task not in TASKS:
      raise ValueError(f"task must be one of {', '.join(TASKS)}, got "
                       f"{self.task!r}")
    if type(self.model) is not TASKS[self.task]:
      raise ValueError(f"task {self.task!r} takes a "
                       f"{TASKS[self.task].__name__} model, got a "
                       f"{type(self.model).__name__}")
    kind = parse_data(self.data)[0]
    if (self.task == "classify") != (kind in EXAMPLE_OPTIONS):
      raise ValueError(
          f"task {self.task!r} reads " + (
              "labelled examples: data must be listops[:...], "
              "pathfinder[:...] or synthetic[:...]"
              if self.task == "classify" else
              "text: data must not be a classification set") +
          f"; got {self.data!r}")
    if not 0 <= self.heldout_fraction < 1:
      raise ValueError("heldout_fraction must be in [0, 1), got "
                       f"{self.heldout_fraction!r}")
    for name, least in (("eval_every", 0), ("sample_every", 0),
                        ("eval_batches", 1), ("sample_tokens", 1),
                        ("log_every", 1)):
      value = getattr(self, name)
      if not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")

  def to_dict(self) -> dict:
    return config_flags.to_dict(self)

  @classmethod
  def field_type(cls, name: str, values: Mapping[str, Any]):
    """The model config's class follows ``values["task"]``
    (``config_flags``)."""
    if name == "model":
      return TASKS.get(values.get("task", "lm"))
    return None

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "Experiment":
    values = dict(values)
    model_class = cls.field_type("model", values)
    if model_class is not None and isinstance(values.get("model"), Mapping):
      values["model"] = model_class.from_dict(values["model"])
    return config_flags.from_dict(cls, values)


def parse_data(spec: str) -> tuple[str, object, dict]:
  """``(kind, what, options)`` of a data spec (``Experiment.data``);
  raises ``ValueError``."""
  kind, _, rest = spec.partition(":")
  if kind == "stdlib" and not rest:
    return "stdlib", None, {}
  if kind == "text" and rest:
    return "text", [p for p in rest.split(",") if p], {}
  if kind == "tokens" and rest:
    path, *pairs = rest.split(",")
    return "tokens", path, _options(pairs, TOKEN_FILE_OPTIONS, spec)
  if kind in EXAMPLE_OPTIONS:
    pairs = [p for p in rest.split(",") if p]
    return kind, None, _options(pairs, EXAMPLE_OPTIONS[kind], spec)
  if kind in RECORD_OPTIONS and rest:
    parts = [p for p in rest.split(",") if p]
    patterns = [p for p in parts if "=" not in p]
    if not patterns:
      raise ValueError(f"data spec {spec!r} names no file pattern")
    options = _options([p for p in parts if "=" in p], RECORD_OPTIONS[kind],
                       spec)
    return kind, patterns, options
  raise ValueError("data must be stdlib, text:GLOB[,GLOB...], "
                   "tokens:PATH[,dtype=uint16][,eos_id=N], "
                   "jsonl:GLOB[,text_field=NAME], "
                   "parquet:GLOB[,text_field=NAME], "
                   "arrayrecord:GLOB[,dtype=uint16], or (task classify) "
                   "listops[:...], pathfinder[:...], synthetic[:...]; got "
                   f"{spec!r}")


def _options(pairs: list[str], allowed: tuple[str, ...], spec: str) -> dict:
  """``{key: value}`` of ``key=value`` parts of a data spec: ints, the
  booleans true / false, strings."""
  options = {}
  for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or key not in allowed:
      raise ValueError(f"data option {pair!r} of {spec!r} is not one of "
                       f"{', '.join(k + '=...' for k in allowed)}")
    if key in _INT_OPTIONS:
      try:
        options[key] = int(value)
      except ValueError:
        raise ValueError(f"data option {pair!r} of {spec!r} is not an "
                         "int") from None
    elif key == "skip_bad_records":
      if value not in ("true", "false"):
        raise ValueError(f"data option {pair!r} of {spec!r} is not true or "
                         "false")
      options[key] = value == "true"
    elif key == "signal":
      try:
        options[key] = float(value)
      except ValueError:
        raise ValueError(f"data option {pair!r} of {spec!r} is not a "
                         "number") from None
    else:
      options[key] = value
  return options
