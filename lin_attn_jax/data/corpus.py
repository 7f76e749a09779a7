"""Corpora: documents as token arrays, with a stable held-out split.

A ``Corpus`` is one flat token array (in memory or memory-mapped) and the
start and length of every document in it. Three sources:

- ``stdlib_corpus``: the Python standard library's own ``.py`` files, one
  document per file, byte tokens. It exists on every machine with Python,
  so defaults never download anything.
- ``text_corpus``: text files or glob patterns, one document per file, byte
  tokens (the same tokenizer).
- ``token_file_corpus``: pre-tokenized ``.npy`` or raw ``.bin`` token files
  (uint16 / uint32), memory-mapped; documents end at an ``eos_id`` or are
  cut into blocks of ``doc_len`` tokens.

The held-out split is by a stable hash (SHA-1) of a document's name (its
path relative to the corpus root, or its index in a token file), so it does
not depend on the order files are found in or on the machine.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import sysconfig

import numpy as np

SPLITS = ("train", "heldout", "all")
BYTE_VOCAB = 256


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
  """Documents ``tokens[starts[i]:starts[i] + lengths[i]]``."""

  # What it is, for messages and checkpoints ("stdlib:train", a path, ...).
  name: str
  # Every token, 1-D unsigned ints (may be a read-only memory map).
  tokens: np.ndarray
  # [n_docs] int64 offsets of each document in tokens.
  starts: np.ndarray
  # [n_docs] int64 token counts (every one >= 1).
  lengths: np.ndarray
  # Token ids are in [0, vocab_size).
  vocab_size: int

  def __post_init__(self):
    if self.tokens.ndim != 1:
      raise ValueError(f"corpus {self.name}: tokens must be 1-D, got shape "
                       f"{self.tokens.shape}")
    if self.starts.shape != self.lengths.shape or self.starts.ndim != 1:
      raise ValueError(f"corpus {self.name}: starts {self.starts.shape} and "
                       f"lengths {self.lengths.shape} must be equal 1-D")
    if not len(self.lengths):
      raise ValueError(f"corpus {self.name} has no documents")

  @property
  def num_documents(self) -> int:
    return len(self.lengths)

  @property
  def num_tokens(self) -> int:
    return int(self.lengths.sum())

  def document(self, index: int) -> np.ndarray:
    start = int(self.starts[index])
    return self.tokens[start:start + int(self.lengths[index])]

  def fingerprint(self) -> str:
    """A short hash of the documents' layout (not of every token)."""
    h = hashlib.sha1()
    h.update(self.name.encode())
    h.update(np.asarray(self.lengths, np.int64).tobytes())
    return h.hexdigest()[:16]


def document_key(data: bytes) -> int:
  """The 64-bit split key of a document: the first 8 bytes of the SHA-1 of
  ``data`` (its name, or its text as UTF-8), big-endian."""
  return int.from_bytes(hashlib.sha1(data).digest()[:8], "big")


def key_in_split(key: int, split: str, heldout_fraction: float) -> bool:
  """Whether the document with split key ``key`` (``document_key``)
  belongs to ``split``: held out when ``key / 2**64 < heldout_fraction``."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if split == "all":
    return True
  heldout = int(key) / 2.0**64 < heldout_fraction
  return heldout == (split == "heldout")


def in_split(key: str, split: str, heldout_fraction: float) -> bool:
  """Whether the document named ``key`` belongs to ``split``."""
  return key_in_split(document_key(key.encode()), split, heldout_fraction)


def check_fraction(heldout_fraction: float) -> None:
  if not 0 <= heldout_fraction < 1:
    raise ValueError(f"heldout_fraction must be in [0, 1), got "
                     f"{heldout_fraction}")


def _from_byte_documents(name: str, docs: list[bytes]) -> Corpus:
  if not docs:
    raise ValueError(f"corpus {name} has no documents in this split")
  lengths = np.array([len(d) for d in docs], np.int64)
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
  tokens = np.frombuffer(b"".join(docs), np.uint8)
  return Corpus(name, tokens, starts, lengths, BYTE_VOCAB)


def stdlib_root() -> str:
  return sysconfig.get_paths()["stdlib"]


def stdlib_corpus(split: str = "train", heldout_fraction: float = 0.02,
                  root: str | None = None) -> Corpus:
  """Every ``.py`` file of the standard library (not site-packages) as a
  document of byte tokens; ``split`` is ``"train"``, ``"heldout"`` or
  ``"all"``."""
  check_fraction(heldout_fraction)
  root = os.path.abspath(root or stdlib_root())
  return _read_files(f"stdlib:{split}", root, python_files(root), split,
                     heldout_fraction)


def python_files(root: str) -> list[str]:
  """The ``.py`` files under ``root`` (outside ``site-packages``,
  ``dist-packages`` and ``__pycache__``), sorted."""
  paths = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames
                         if d not in ("site-packages", "dist-packages",
                                      "__pycache__"))
    paths += [os.path.join(dirpath, f) for f in sorted(filenames)
              if f.endswith(".py")]
  return sorted(paths)


def _read_files(name, root, paths, split, heldout_fraction) -> Corpus:
  docs = []
  for path in paths:
    if not in_split(os.path.relpath(path, root), split, heldout_fraction):
      continue
    with open(path, "rb") as f:
      data = f.read()
    if data:
      docs.append(data)
  return _from_byte_documents(name, docs)


def text_corpus(patterns: str | list[str], split: str = "train",
                heldout_fraction: float = 0.02) -> Corpus:
  """Text files named by paths or glob patterns (``**`` recurses), one
  document per file, byte tokens."""
  check_fraction(heldout_fraction)
  if isinstance(patterns, str):
    patterns = [p for p in patterns.split(",") if p]
  paths = set()
  for pattern in patterns:
    found = glob.glob(os.path.expanduser(pattern), recursive=True)
    if not found:
      raise ValueError(f"no file matches {pattern!r}")
    paths.update(os.path.abspath(p) for p in found if os.path.isfile(p))
  if not paths:
    raise ValueError(f"no files in {patterns}")
  paths = sorted(paths)
  root = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(
      paths[0])
  return _read_files(f"text:{','.join(patterns)}:{split}", root, paths,
                     split, heldout_fraction)


def token_file_corpus(path: str, *, dtype: str | None = None,
                      eos_id: int | None = None, doc_len: int = 4096,
                      vocab_size: int | None = None, split: str = "train",
                      heldout_fraction: float = 0.02) -> Corpus:
  """A pre-tokenized file: ``.npy`` (1-D, uint16/uint32) or raw ``.bin``
  (``dtype`` required), memory-mapped.

  Documents are those of the shard index ``index_path(path)`` when it
  exists (``python -m experiments.tokenize`` writes one; the split is then
  by its keys, the documents' texts), else they end after each ``eos_id``
  token when it is given, else the file is cut into blocks of ``doc_len``
  tokens (the split is then by document number). ``vocab_size`` defaults to the
  largest token + 1 (one pass over the file).
  """
  check_fraction(heldout_fraction)
  if path.endswith(".npy"):
    tokens = np.load(path, mmap_mode="r")
  elif path.endswith(".bin"):
    if dtype not in ("uint16", "uint32"):
      raise ValueError(f"a .bin token file needs dtype uint16 or uint32, got "
                       f"{dtype!r}")
    tokens = np.memmap(path, dtype=dtype, mode="r")
  else:
    raise ValueError(f"token files are .npy or .bin, got {path!r}")
  if tokens.ndim != 1 or tokens.dtype not in (np.uint16, np.uint32):
    raise ValueError(f"{path}: tokens must be 1-D uint16 or uint32, got "
                     f"{tokens.dtype} with shape {tokens.shape}")
  if not len(tokens):
    raise ValueError(f"{path} holds no tokens")
  index = index_path(path)
  keys = None
  if os.path.exists(index):
    offsets, keys = read_index(index, len(tokens))
    ends = offsets[1:]
  elif eos_id is not None:
    ends = np.flatnonzero(np.asarray(tokens) == eos_id) + 1
    if not len(ends) or ends[-1] != len(tokens):
      ends = np.append(ends, len(tokens))
  else:
    if doc_len < 2:
      raise ValueError(f"doc_len must be >= 2, got {doc_len}")
    ends = np.append(np.arange(doc_len, len(tokens), doc_len), len(tokens))
  starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
  lengths = (ends - starts).astype(np.int64)
  if keys is None:
    keep = np.array([in_split(f"{i}", split, heldout_fraction)
                     for i in range(len(starts))], bool)
  else:
    keep = np.array([key_in_split(k, split, heldout_fraction) for k in keys],
                    bool)
  if not keep.any():
    raise ValueError(f"{path} has no documents in split {split!r}")
  if vocab_size is None:
    vocab_size = int(np.max(tokens)) + 1
  return Corpus(f"{os.path.basename(path)}:{split}", tokens, starts[keep],
                lengths[keep], vocab_size)


def index_path(shard: str) -> str:
  """The index beside a token shard: ``shard-00003.bin`` ->
  ``shard-00003.index.npz``."""
  return os.path.splitext(shard)[0] + ".index.npz"


def write_index(path: str, lengths: np.ndarray, keys: np.ndarray) -> None:
  """A shard index: ``offsets`` ``[n_docs + 1]`` int64 (document ``i`` is
  tokens ``offsets[i]:offsets[i + 1]``) and ``keys`` ``[n_docs]`` uint64
  (``document_key`` of each document's text)."""
  offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  with open(path, "wb") as f:
    np.savez(f, offsets=offsets, keys=np.asarray(keys, np.uint64))


def read_index(path: str, num_tokens: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
  """``(offsets, keys)`` of a shard index (``write_index``), checked
  against the shard's ``num_tokens`` when given."""
  with np.load(path) as index:
    offsets, keys = index["offsets"], index["keys"]
  if (offsets.ndim != 1 or len(offsets) != len(keys) + 1 or offsets[0] != 0
      or np.any(np.diff(offsets) < 1)):
    raise ValueError(f"{path}: offsets must start at 0 and increase, one "
                     f"more than the {len(keys)} keys")
  if num_tokens is not None and offsets[-1] != num_tokens:
    raise ValueError(f"{path}: offsets end at {offsets[-1]}, the shard holds "
                     f"{num_tokens} tokens")
  return offsets, keys
