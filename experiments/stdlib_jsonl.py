"""The standard library's source as jsonl shards, and a byte-level BPE
trained on their training split: the text of ``make run-bpe``.

  python -m experiments.stdlib_jsonl --config.out_dir=runs/stdlib-bpe \\
      --config.vocab_size=1024

writes into ``out_dir``

- ``jsonl/part-XXXXX.jsonl``: one line per ``.py`` file of the standard
  library (``corpus.stdlib_corpus``'s documents), ``{"text": ..., "path":
  ...}`` with the path relative to the root; the sorted files are cut into
  ``shards`` consecutive runs. Files that are not UTF-8 (a few test files)
  are left out and counted;
- ``tokenizer/``: ``tokenizer.json`` and ``tokenizer_config.json`` of a
  byte-level BPE (``lin_attn_jax.data.train_bpe``) of ``vocab_size`` ids,
  trained on the documents of the training split only: the split of
  ``jsonl:`` data, by the key of each document's text
  (``corpus.key_in_split``), with ``heldout_fraction`` as in training, so
  the held-out documents stay unseen;
- ``settings.json``: the settings, written last; a rerun with the same
  settings keeps what is there, one with other settings writes everything
  anew.

Then ``python -m experiments.tokenize`` turns the shards into ArrayRecord
token shards and ``python -m experiments.train`` trains on them with the
tokenizer (``docs/training.md``, the ``run-bpe`` target of the Makefile).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import time

from absl import app, flags
import numpy as np

from experiments import config_flags
from lin_attn_jax.data import corpus as corpus_lib
from lin_attn_jax.data import train_bpe
from lin_attn_jax.ops.common import checks

SETTINGS = "settings.json"
JSONL_DIR = "jsonl"
TOKENIZER_DIR = "tokenizer"


@dataclasses.dataclass(frozen=True)
class StdlibJsonlConfig:
  """Where the shards go, how many, and the BPE's vocabulary."""

  # Where jsonl/, tokenizer/ and settings.json go.
  out_dir: str = ""
  # Read the .py files under this directory instead of the standard
  # library ("").
  root: str = ""
  # jsonl files the documents are spread over.
  shards: int = 8
  # The BPE's vocabulary, its three special tokens included (> 259); 0
  # writes the shards only.
  vocab_size: int = 1024
  # Fraction of the documents held out (the training runs'
  # config.heldout_fraction); the BPE does not see them.
  heldout_fraction: float = 0.02

  def __post_init__(self):
    checks.positive_int("shards", self.shards)
    if self.vocab_size != 0:
      checks.positive_int("vocab_size", self.vocab_size, also=" or 0")
    corpus_lib.check_fraction(self.heldout_fraction)

  def to_dict(self) -> dict:
    return config_flags.to_dict(self)

  @classmethod
  def from_dict(cls, values) -> "StdlibJsonlConfig":
    return config_flags.from_dict(cls, values)


PRESETS = {"default": StdlibJsonlConfig()}


def documents(root: str) -> tuple[list[tuple[str, str]], int]:
  """``([(relative path, text), ...], skipped)``: the non-empty UTF-8
  ``.py`` files under ``root`` in sorted order, and the count of files left
  out because they are not UTF-8."""
  docs, skipped = [], 0
  for path in corpus_lib.python_files(root):
    with open(path, "rb") as f:
      data = f.read()
    if not data:
      continue
    try:
      docs.append((os.path.relpath(path, root), data.decode("utf-8")))
    except UnicodeDecodeError:
      skipped += 1
  return docs, skipped


def write_shards(directory: str, docs: list[tuple[str, str]],
                 shards: int) -> list[str]:
  """``docs`` as ``shards`` jsonl files of consecutive documents; returns
  their paths."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for number, part in enumerate(np.array_split(np.arange(len(docs)),
                                               shards)):
    path = os.path.join(directory, f"part-{number:05d}.jsonl")
    with open(path + ".part", "w", encoding="utf-8") as f:
      for i in part:
        name, text = docs[i]
        f.write(json.dumps({"text": text, "path": name}) + "\n")
    os.replace(path + ".part", path)
    paths.append(path)
  return paths


def prepare(config: StdlibJsonlConfig, say=print) -> dict:
  """Writes the shards and the tokenizer of ``config`` unless a previous
  run with the same settings did; returns the settings written."""
  if not config.out_dir:
    raise config_flags.FlagError(f"{config_flags.PREFIX}.out_dir",
                                 "is required")
  root = os.path.abspath(config.root or corpus_lib.stdlib_root())
  settings = {**config.to_dict(), "root": root}
  settings.pop("out_dir")
  path = os.path.join(config.out_dir, SETTINGS)
  if os.path.exists(path):
    with open(path) as f:
      if json.load(f) == settings:
        say(f"{config.out_dir} holds the shards and tokenizer of these "
            "settings; kept")
        return settings
  began = time.perf_counter()
  docs, skipped = documents(root)
  if not docs:
    raise ValueError(f"no .py file under {root}")
  if os.path.exists(path):
    os.remove(path)
  shard_dir = os.path.join(config.out_dir, JSONL_DIR)
  for old in glob.glob(os.path.join(shard_dir, "part-*.jsonl")):
    os.remove(old)
  paths = write_shards(shard_dir, docs, config.shards)
  size = sum(os.path.getsize(p) for p in paths)
  say(f"{len(docs)} documents of {root} in {len(paths)} jsonl shards "
      f"({size / 1e6:.1f} MB) in {shard_dir} "
      f"({time.perf_counter() - began:.1f} s); {skipped} files that are "
      "not UTF-8 left out")
  if config.vocab_size:
    began = time.perf_counter()
    train = [text for _, text in docs if corpus_lib.key_in_split(
        corpus_lib.document_key(text.encode("utf-8")), "train",
        config.heldout_fraction)]
    tokenizer = train_bpe(train, config.vocab_size)
    folder = os.path.join(config.out_dir, TOKENIZER_DIR)
    tokenizer.save(folder)
    say(f"byte-level BPE of {tokenizer.vocab_size} ids trained on "
        f"{len(train)} training documents in {folder} "
        f"({time.perf_counter() - began:.1f} s)")
  with open(path, "w") as f:
    json.dump(settings, f, indent=1)
  return settings


FLAGS = flags.FLAGS
OVERRIDES: dict = {}


def main(argv):
  config = config_flags.command_config(argv, PRESETS, "default", OVERRIDES)
  try:
    prepare(config)
  except (ValueError, OSError) as error:
    config_flags.fail(str(error))


if __name__ == "__main__":
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES))
