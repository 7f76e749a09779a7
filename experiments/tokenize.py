"""Turns a corpus into token shards, in parallel and resumably.

  python -m experiments.tokenize --config.data='jsonl:corpus/*.jsonl' \\
      --config.out_dir=tokens/corpus --config.workers=2
  python -m experiments.tokenize --config.data='parquet:shards/*.parquet' \\
      --config.out_dir=tokens/p --config.format=bin

The input is a data spec of text (``text:GLOB``, a document per file;
``jsonl:GLOB[,text_field=NAME]``; ``parquet:GLOB[,text_field=NAME]``;
``skip_bad_records=true`` on the last two). Its files, in sorted order, are
cut into groups of ``files_per_shard``; group ``i`` becomes shard
``shard-{i:05d}`` in ``out_dir``, tokenized by one of ``workers``
processes (several each tokenize in one thread; a single one lets the
``tokenizers`` library use its threads):

- ``format=array_record``: ``shard-XXXXX.array_record``, a record of
  ``dtype`` token ids per document (``arrayrecord:OUT_DIR/*.array_record``
  reads them back);
- ``format=bin``: ``shard-XXXXX.bin``, the documents' tokens one after the
  other (``tokens:OUT_DIR/shard-00000.bin,dtype=uint16`` reads a shard);

each with ``shard-XXXXX.index.npz``: document offsets and the split keys of
the documents' texts (``lin_attn_jax/data/corpus.py``), so that the
held-out split is the one of the text. Documents are tokenized as the
training data readers do (``lin_attn_jax/data/sources.py``).

``manifest.json`` in ``out_dir`` lists the settings (the tokenizer's
files' hash among them) and every finished shard with the size and
modification time of its inputs; a rerun with the same settings skips the
shards whose inputs are unchanged, and one with other settings is refused.
A line per finished shard reports the progress.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import time

from absl import app, flags, logging
import numpy as np

from experiments import config_flags
from experiments.configs.base import parse_data
from lin_attn_jax.data import corpus as corpus_lib
from lin_attn_jax.data import sources, tokenizers
from lin_attn_jax.ops.common import checks

FORMATS = {"array_record": ".array_record", "bin": ".bin"}
TEXT_KINDS = ("text", "jsonl", "parquet")
MANIFEST = "manifest.json"


def load_tokenizer(name: str):
  """The tokenizer ``name`` names (``tokenizers.load_tokenizer``: ``"bytes"``,
  a ``tokenizer.json``, a SentencePiece ``.model`` or a directory)."""
  return tokenizers.load_tokenizer(name)


@dataclasses.dataclass(frozen=True)
class TokenizeConfig:
  """What to tokenize, with what, and into which shards."""

  # The corpus: "text:GLOB", "jsonl:GLOB[,text_field=NAME]" or
  # "parquet:GLOB[,text_field=NAME]" (experiments/configs/base.py).
  data: str = ""
  # Where the shards and manifest.json go.
  out_dir: str = ""
  # The tokenizer: "bytes" (UTF-8 bytes, no eos), a tokenizer.json, a
  # SentencePiece .model or a directory holding one.
  tokenizer: str = "bytes"
  # "array_record" or "bin".
  format: str = "array_record"
  # Input files per shard.
  files_per_shard: int = 1
  # Processes that tokenize shards at the same time.
  workers: int = 2

  def __post_init__(self):
    if self.data and parse_data(self.data)[0] not in TEXT_KINDS:
      raise ValueError(f"data must be text, jsonl or parquet, got "
                       f"{self.data!r}")
    if self.format not in FORMATS:
      raise ValueError(f"format must be one of {', '.join(FORMATS)}, got "
                       f"{self.format!r}")
    for name in ("files_per_shard", "workers"):
      checks.positive_int(name, getattr(self, name))
    load_tokenizer(self.tokenizer)

  def to_dict(self) -> dict:
    return config_flags.to_dict(self)

  @classmethod
  def from_dict(cls, values) -> "TokenizeConfig":
    return config_flags.from_dict(cls, values)


PRESETS = {"default": TokenizeConfig()}


def file_texts(path: str, _text_field: str):
  """``(where, text)`` of a text file: one document, strict UTF-8."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    yield path, data.decode("utf-8")
  except UnicodeDecodeError as error:
    yield path, ValueError(f"{path}: not UTF-8 ({error.reason} at byte "
                           f"{error.start})")


READERS = {"text": file_texts, "jsonl": sources.jsonl_texts,
           "parquet": sources.parquet_texts}


def shard_plan(config: TokenizeConfig) -> list[list[str]]:
  """The input files of every shard, in order."""
  _, patterns, _ = parse_data(config.data)
  paths = sources.find_files(patterns)
  k = config.files_per_shard
  return [paths[i:i + k] for i in range(0, len(paths), k)]


def tokenizer_fingerprint(name: str) -> str:
  """A SHA-1 of the tokenizer's files (``"bytes"`` for bytes), so that a
  tokenizer retrained at the same path is not taken for the old one."""
  if name == "bytes":
    return name
  path = os.path.expanduser(name)
  if os.path.isdir(path):
    files = tokenizers.tokenizer_files(path)
  else:
    folder = os.path.dirname(path)
    files = [path] + [os.path.join(folder, f)
                      for f in tokenizers.SPECIAL_TOKEN_FILES[:2]
                      if os.path.isfile(os.path.join(folder, f))]
  digest = hashlib.sha1()
  for file in files:
    with open(file, "rb") as f:
      digest.update(f.read())
  return digest.hexdigest()


def settings(config: TokenizeConfig, dtype: str) -> dict:
  """What a manifest's shards depend on."""
  return {"data": config.data, "tokenizer": config.tokenizer,
          "tokenizer_sha1": tokenizer_fingerprint(config.tokenizer),
          "format": config.format, "files_per_shard": config.files_per_shard,
          "dtype": dtype}


def stamps(paths: list[str]) -> list[list[int]]:
  """``[size, mtime_ns]`` of each input file: a shard whose inputs changed
  since it was written is written again."""
  return [[os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in paths]


def write_shard(job: tuple) -> dict:
  """Tokenizes the files of one shard and writes it and its index; returns
  its manifest entry."""
  config, number, paths, dtype = job
  began = time.perf_counter()
  kind, _, options = parse_data(config.data)
  tokenizer = load_tokenizer(config.tokenizer)
  records = sources.Records(f"shard {number}",
                            options.get("skip_bad_records", False))
  read_bytes = 0
  for path in paths:
    read_bytes += os.path.getsize(path)
    sources.tokenize_texts(
        records, READERS[kind](path, options.get("text_field", "text")),
        tokenizer)
  stem = os.path.join(config.out_dir, f"shard-{number:05d}")
  shard = stem + FORMATS[config.format]
  lengths = np.array([len(d) for d in records.docs], np.int64)
  part = shard + ".part"
  if config.format == "array_record":
    sources.write_array_record(part, records.docs, dtype)
  else:
    with open(part, "wb") as f:
      for doc in records.docs:
        f.write(np.asarray(doc, dtype).tobytes())
  corpus_lib.write_index(corpus_lib.index_path(shard), lengths,
                         np.array(records.keys, np.uint64))
  os.replace(part, shard)
  return {"shard": os.path.basename(shard), "inputs": paths,
          "input_stamps": stamps(paths),
          "documents": len(lengths), "tokens": int(lengths.sum()),
          "skipped": records.skipped, "bytes_read": read_bytes,
          "seconds": time.perf_counter() - began}


def one_thread_each() -> None:
  """The initializer of each of several worker processes: the
  ``tokenizers`` library then works in the calling thread, a core per
  process."""
  os.environ["TOKENIZERS_PARALLELISM"] = "false"


def read_manifest(config: TokenizeConfig, dtype: str) -> dict:
  path = os.path.join(config.out_dir, MANIFEST)
  if not os.path.exists(path):
    return {"settings": settings(config, dtype), "shards": {}}
  with open(path) as f:
    manifest = json.load(f)
  if manifest["settings"] != settings(config, dtype):
    raise ValueError(f"{path} was written with {manifest['settings']}, not "
                     f"{settings(config, dtype)}; use another out_dir")
  return manifest


def write_manifest(config: TokenizeConfig, manifest: dict) -> None:
  path = os.path.join(config.out_dir, MANIFEST)
  with open(path + ".part", "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  os.replace(path + ".part", path)


def tokenize(config: TokenizeConfig) -> dict:
  """Writes the shards that ``manifest.json`` does not list yet; returns
  the manifest."""
  if not config.data or not config.out_dir:
    raise config_flags.FlagError(
        config_flags.PREFIX, "--config.data and --config.out_dir are "
        "required")
  tokenizer = load_tokenizer(config.tokenizer)
  dtype = "uint16" if tokenizer.vocab_size <= 2**16 else "uint32"
  os.makedirs(config.out_dir, exist_ok=True)
  manifest = read_manifest(config, dtype)
  plan = shard_plan(config)
  jobs = [(config, i, paths, dtype) for i, paths in enumerate(plan)
          if str(i) not in manifest["shards"]
          or manifest["shards"][str(i)]["inputs"] != paths
          or manifest["shards"][str(i)].get("input_stamps") != stamps(paths)]
  logging.info("%d shards, %d done before, %d to write with %d workers",
               len(plan), len(plan) - len(jobs), len(jobs), config.workers)
  start, done_bytes = time.perf_counter(), 0
  context = multiprocessing.get_context("spawn")
  workers = min(config.workers, max(len(jobs), 1))
  with context.Pool(workers, one_thread_each if workers > 1 else None
                    ) as pool:
    for done, entry in enumerate(pool.imap_unordered(write_shard, jobs), 1):
      number = int(entry["shard"][len("shard-"):].split(".")[0])
      manifest["shards"][str(number)] = entry
      write_manifest(config, manifest)
      done_bytes += entry["bytes_read"]
      seconds = time.perf_counter() - start
      logging.info("[%d/%d] %s: %d documents, %d tokens, %.2f MB/s",
                   done, len(jobs), entry["shard"], entry["documents"],
                   entry["tokens"], done_bytes / 1e6 / max(seconds, 1e-9))
  write_manifest(config, manifest)
  return manifest


FLAGS = flags.FLAGS
OVERRIDES: dict = {}


def main(argv):
  config = config_flags.command_config(argv, PRESETS, "default", OVERRIDES)
  try:
    manifest = tokenize(config)
  except (ValueError, OSError, ImportError) as error:
    config_flags.fail(str(error))
  shards = manifest["shards"].values()
  print(f"{len(manifest['shards'])} shards, "
        f"{sum(s['documents'] for s in shards)} documents, "
        f"{sum(s['tokens'] for s in shards)} tokens in {config.out_dir}")


if __name__ == "__main__":
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES))
