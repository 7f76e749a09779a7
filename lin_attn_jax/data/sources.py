"""Corpora from record files: jsonl, parquet and ArrayRecord shards.

Each source gives the same ``Corpus`` as ``corpus.py`` (one flat token
array, the start and length of every document), so packing, segment ids,
batches as a pure function of ``(seed, step)`` and per-process reading work
unchanged.

- ``jsonl_corpus``: one JSON object per line, its ``text_field`` the
  document;
- ``parquet_corpus``: one row per document, its ``text_field`` column
  (pyarrow, the ``parquet`` extra);
- ``array_record_corpus``: pre-tokenized ArrayRecord shards (the format
  grain reads fastest), one record per document, the token ids as
  little-endian ``uint16`` / ``uint32``.

Files are read in the sorted order of their absolute paths, records in
file order. Text is tokenized with any object that has ``encode_batch``
(a list of texts to lists of ids), ``vocab_size`` and ``eos_id`` (None for
none): a document is ``encode(text) + [eos_id]`` (no eos when ``eos_id`` is
None). Documents with no tokens are dropped, and their count logged.

The held-out split is by ``document_key`` of a document's text (UTF-8), so
it depends neither on the file layout, nor on the format, nor on the
tokenizer: the same documents in jsonl, parquet or in ArrayRecord shards
written by ``python -m experiments.tokenize`` (whose shard index holds the
text keys) give the same split and the same batches. An ArrayRecord shard
without an index is split by the key of its records' bytes.

Bad input raises ``ValueError`` naming the file and the line (jsonl), row
(parquet) or record (ArrayRecord): an empty glob, a missing field or
column, a line that is not UTF-8 or not a JSON object, a token id outside
the vocabulary. With ``skip_bad_records`` the bad records are left out
instead, and their count is logged.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator, Protocol, Sequence

from absl import logging
import numpy as np

from lin_attn_jax.data import corpus as corpus_lib
from lin_attn_jax.data.corpus import Corpus
from lin_attn_jax.data.tokenizers import ByteTokenizer

# How many texts go to one encode_batch call.
ENCODE_BATCH = 256
# The dtypes of ArrayRecord token records.
RECORD_DTYPES = ("uint16", "uint32")


class TextTokenizer(Protocol):
  """What the readers need of a tokenizer."""

  vocab_size: int
  eos_id: int | None

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    ...


def token_dtype(vocab_size: int) -> type:
  """The smallest unsigned dtype that holds ids below ``vocab_size``."""
  for dtype in (np.uint8, np.uint16, np.uint32):
    if vocab_size <= np.iinfo(dtype).max + 1:
      return dtype
  raise ValueError(f"vocab_size {vocab_size} does not fit in uint32")




def find_files(patterns: str | Sequence[str]) -> list[str]:
  """Absolute paths of the files that paths or glob patterns (``**``
  recurses; a string is split at commas) name, sorted; raises
  ``ValueError`` naming a pattern that matches no file."""
  if isinstance(patterns, str):
    patterns = [p for p in patterns.split(",") if p]
  if not patterns:
    raise ValueError("no file pattern given")
  paths = set()
  for pattern in patterns:
    found = [p for p in glob.glob(os.path.expanduser(pattern),
                                  recursive=True) if os.path.isfile(p)]
    if not found:
      raise ValueError(f"no file matches {pattern!r}")
    paths.update(os.path.abspath(p) for p in found)
  return sorted(paths)


class Records:
  """Documents gathered from records, with the count of skipped ones."""

  def __init__(self, name: str, skip_bad_records: bool):
    self.name, self.skip = name, skip_bad_records
    self.docs: list[np.ndarray] = []
    self.keys: list[int] = []
    self.skipped = self.empty = 0

  def bad(self, message: str) -> None:
    if not self.skip:
      raise ValueError(message + " (skip_bad_records=True leaves such "
                       "records out)")
    self.skipped += 1

  def add(self, tokens: np.ndarray, key: int, where: str,
          vocab_size: int | None) -> None:
    if not len(tokens):
      self.empty += 1
      return
    if vocab_size is not None:
      top = int(tokens.max())
      if top >= vocab_size:
        self.bad(f"{where}: token id {top} is outside the vocabulary of "
                 f"{vocab_size} ids")
        return
    self.docs.append(tokens)
    self.keys.append(key)

  def corpus(self, split: str, heldout_fraction: float,
             vocab_size: int | None) -> Corpus:
    if self.skipped:
      logging.warning("%s: skipped %d bad records", self.name, self.skipped)
    if self.empty:
      logging.info("%s: dropped %d documents with no tokens", self.name,
                   self.empty)
    keep = [i for i, key in enumerate(self.keys)
            if corpus_lib.key_in_split(key, split, heldout_fraction)]
    if not keep:
      raise ValueError(f"corpus {self.name} has no documents in split "
                       f"{split!r}")
    docs = [self.docs[i] for i in keep]
    lengths = np.array([len(d) for d in docs], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    top = max(int(d.max()) for d in docs)
    if vocab_size is None:
      vocab_size = top + 1
    dtype = token_dtype(vocab_size)
    tokens = np.concatenate(docs).astype(dtype)
    return Corpus(self.name, tokens, starts, lengths, vocab_size)


def tokenize_texts(records: Records, texts: Iterator[tuple[str, object]],
              tokenizer: TextTokenizer) -> None:
  """Tokenizes ``(where, text)`` pairs into ``records``; a text that is an
  exception is a bad record whose message it holds."""
  eos = getattr(tokenizer, "eos_id", None)
  pending: list[tuple[str, str]] = []

  def flush():
    texts = [text.encode("utf-8") for _, text in pending]
    if isinstance(tokenizer, ByteTokenizer):
      # The bytes are the ids: no list of Python ints.
      ids = [np.frombuffer(text, np.uint8) for text in texts]
    else:
      ids = tokenizer.encode_batch([text for _, text in pending])
    for (where, _), text, doc in zip(pending, texts, ids):
      if not isinstance(doc, np.ndarray):
        doc = np.asarray(doc, np.int64)
      if eos is not None:
        doc = np.append(doc.astype(np.int64), eos)
      records.add(doc, corpus_lib.document_key(text), where,
                  tokenizer.vocab_size)
    pending.clear()

  for where, text in texts:
    if isinstance(text, Exception):
      records.bad(str(text))
      continue
    pending.append((where, text))
    if len(pending) == ENCODE_BATCH:
      flush()
  if pending:
    flush()


def jsonl_texts(path: str, text_field: str = "text"
                ) -> Iterator[tuple[str, object]]:
  """``(where, text)`` for every line of a jsonl file (``where`` is
  ``"PATH, line N"``); a bad line gives a ``ValueError`` as its text."""
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      where = f"{path}, line {number}"
      try:
        record = json.loads(line.decode("utf-8"))
      except UnicodeDecodeError as error:
        yield where, ValueError(f"{where}: not UTF-8 ({error.reason} at "
                                f"byte {error.start})")
        continue
      except json.JSONDecodeError as error:
        yield where, ValueError(f"{where}: not JSON ({error.msg} at column "
                                f"{error.colno})")
        continue
      if not isinstance(record, dict):
        yield where, ValueError(f"{where}: not a JSON object")
      elif text_field not in record:
        yield where, ValueError(f"{where}: no field {text_field!r} (fields: "
                                f"{', '.join(map(repr, record))})")
      elif not isinstance(record[text_field], str):
        yield where, ValueError(f"{where}: field {text_field!r} is "
                                f"{type(record[text_field]).__name__}, not "
                                "a string")
      else:
        yield where, record[text_field]


def parquet_texts(path: str, text_field: str = "text"
                  ) -> Iterator[tuple[str, object]]:
  """``(where, text)`` for every row of a parquet file (``where`` is
  ``"PATH, row N"``, from 1); a bad row gives a ``ValueError``."""
  try:
    import pyarrow.parquet as pq
  except ImportError:
    raise ImportError("parquet data needs pyarrow: pip install "
                      "'lin_attn_jax[parquet]'") from None
  table = pq.ParquetFile(path)
  names = table.schema_arrow.names
  if text_field not in names:
    raise ValueError(f"{path}: no column {text_field!r} (columns: "
                     f"{', '.join(map(repr, names))})")
  number = 0
  for batch in table.iter_batches(columns=[text_field]):
    for value in batch.column(0).to_pylist():
      number += 1
      where = f"{path}, row {number}"
      if isinstance(value, bytes):
        try:
          value = value.decode("utf-8")
        except UnicodeDecodeError as error:
          yield where, ValueError(f"{where}: column {text_field!r} is not "
                                  f"UTF-8 ({error.reason} at byte "
                                  f"{error.start})")
          continue
      if not isinstance(value, str):
        yield where, ValueError(f"{where}: column {text_field!r} is "
                                f"{type(value).__name__}, not a string")
      else:
        yield where, value


def _text_corpus(kind, reader, patterns, tokenizer, text_field, split,
                 heldout_fraction, skip_bad_records) -> Corpus:
  corpus_lib.check_fraction(heldout_fraction)
  paths = find_files(patterns)
  joined = patterns if isinstance(patterns, str) else ",".join(patterns)
  records = Records(f"{kind}:{joined}:{split}", skip_bad_records)
  for path in paths:
    tokenize_texts(records, reader(path, text_field), tokenizer)
  return records.corpus(split, heldout_fraction, tokenizer.vocab_size)


def jsonl_corpus(patterns: str | Sequence[str], tokenizer: TextTokenizer,
                 *, text_field: str = "text", split: str = "train",
                 heldout_fraction: float = 0.02,
                 skip_bad_records: bool = False) -> Corpus:
  """jsonl files (paths or globs), one document per line: the line's
  ``text_field``, tokenized; see the module docstring."""
  return _text_corpus("jsonl", jsonl_texts, patterns, tokenizer, text_field,
                      split, heldout_fraction, skip_bad_records)


def parquet_corpus(patterns: str | Sequence[str], tokenizer: TextTokenizer,
                   *, text_field: str = "text", split: str = "train",
                   heldout_fraction: float = 0.02,
                   skip_bad_records: bool = False) -> Corpus:
  """parquet files (paths or globs), one document per row: its
  ``text_field`` column (string or UTF-8 binary), tokenized; see the module
  docstring."""
  return _text_corpus("parquet", parquet_texts, patterns, tokenizer,
                      text_field, split, heldout_fraction, skip_bad_records)


def write_array_record(path: str, docs: Sequence[np.ndarray],
                       dtype: str = "uint32") -> None:
  """One record per document: its token ids as little-endian ``dtype``."""
  from array_record.python import array_record_module
  if dtype not in RECORD_DTYPES:
    raise ValueError(f"dtype must be one of {RECORD_DTYPES}, got {dtype!r}")
  writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
  for doc in docs:
    writer.write(np.asarray(doc).astype(np.dtype(dtype).newbyteorder("<"))
                 .tobytes())
  writer.close()


def array_record_corpus(patterns: str | Sequence[str], *,
                        dtype: str = "uint32",
                        vocab_size: int | None = None, split: str = "train",
                        heldout_fraction: float = 0.02,
                        skip_bad_records: bool = False) -> Corpus:
  """ArrayRecord shards (paths or globs) of token records
  (``write_array_record``); the split is by the keys of each shard's index
  (``corpus.index_path``) when it has one. ``vocab_size`` defaults to the
  largest token + 1; a token at or above it is a bad record."""
  from array_record.python import array_record_module
  corpus_lib.check_fraction(heldout_fraction)
  if dtype not in RECORD_DTYPES:
    raise ValueError(f"dtype must be one of {RECORD_DTYPES}, got {dtype!r}")
  width = np.dtype(dtype).itemsize
  joined = patterns if isinstance(patterns, str) else ",".join(patterns)
  records = Records(f"arrayrecord:{joined}:{split}", skip_bad_records)
  for path in find_files(patterns):
    reader = array_record_module.ArrayRecordReader(path)
    try:
      data = reader.read_all()
    finally:
      reader.close()
    keys = None
    if os.path.exists(corpus_lib.index_path(path)):
      _, keys = corpus_lib.read_index(corpus_lib.index_path(path))
      if len(keys) != len(data):
        raise ValueError(f"{corpus_lib.index_path(path)}: {len(keys)} "
                         f"documents, {path} has {len(data)} records")
    for number, record in enumerate(data):
      where = f"{path}, record {number}"
      if len(record) % width:
        records.bad(f"{where}: {len(record)} bytes is not a whole number "
                    f"of {dtype} tokens")
        continue
      tokens = np.frombuffer(record, np.dtype(dtype).newbyteorder("<"))
      key = (int(keys[number]) if keys is not None
             else corpus_lib.document_key(record))
      records.add(tokens, key, where, vocab_size)
  return records.corpus(split, heldout_fraction, vocab_size)
