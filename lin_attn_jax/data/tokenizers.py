"""Tokenizers: text to token ids and back, behind one interface.

- ``ByteTokenizer``: the UTF-8 bytes of the text are the ids (vocabulary
  256, no special tokens), the encoding of ``corpus.stdlib_corpus`` and
  ``corpus.text_corpus``; the default.
- ``HFTokenizer``: a Hugging Face ``tokenizers`` tokenizer read from a
  ``tokenizer.json`` (the file every HF checkpoint ships); the optional
  ``tokenizers`` extra.
- ``SentencePieceTokenizer``: a SentencePiece ``.model``; the optional
  ``sentencepiece`` extra.

``load_tokenizer(path)`` picks one by the files it finds and reads the
bos/eos/pad ids from ``tokenizer_config.json``, ``special_tokens_map.json``
or ``config.json`` beside them. ``check_vocab`` compares a model's
vocabulary with a tokenizer's: a larger model vocabulary is padding (ids the
tokenizer never produces), a smaller one cannot embed every id.
``token_bytes`` counts the UTF-8 bytes of text each id stands for, so that
a loss per byte compares across tokenizers. ``IncrementalDecoder`` turns
ids arriving one by one into text without breaking a character whose
bytes span several tokens. Nothing here downloads anything.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

BYTE_VOCAB = 256
# The file names load_tokenizer recognises, in order of preference.
HF_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"
# Files beside a tokenizer that name its special tokens, read in this order
# (a later file fills only what the earlier ones left unset).
# ``hf_config.json`` is the source checkpoint's config.json, which
# experiments.convert keeps in a workdir.
SPECIAL_TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json",
                       "config.json", "hf_config.json")


@runtime_checkable
class Tokenizer(Protocol):
  """What training, evaluation and generation need of a tokenizer.

  ``vocab_size`` bounds every id ``encode`` returns (``0 <= id <
  vocab_size``); ``bos_id``, ``eos_id`` and ``pad_id`` are ids or None.
  ``encode`` adds no special tokens; ``decode`` drops the special ones.
  """

  vocab_size: int
  bos_id: int | None
  eos_id: int | None
  pad_id: int | None

  def encode(self, text: str) -> list[int]:
    ...

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    ...

  def decode(self, ids: Iterable[int]) -> str:
    ...


class _Base:
  """``encode_batch`` as a loop over ``encode``, and a readable repr."""

  bos_id: int | None = None
  eos_id: int | None = None
  pad_id: int | None = None

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(text) for text in texts]

  def __repr__(self):
    return (f"{type(self).__name__}(vocab_size={self.vocab_size}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id}, "
            f"pad_id={self.pad_id})")


class ByteTokenizer(_Base):
  """The UTF-8 bytes of the text as ids; ``decode`` replaces bytes that are
  not valid UTF-8 with U+FFFD."""

  vocab_size = BYTE_VOCAB

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < BYTE_VOCAB]
    if bad:
      raise ValueError(f"byte ids are in [0, 256), got {bad[:5]}")
    return bytes(ids).decode("utf-8", errors="replace")


def _import(module: str, extra: str):
  try:
    return __import__(module)
  except ImportError as error:
    raise ImportError(f"this tokenizer needs the {module!r} package: pip "
                      f"install -e '.[{extra}]'") from error


class HFTokenizer(_Base):
  """A Hugging Face ``tokenizers.Tokenizer`` (from ``tokenizer.json`` or
  built in memory); ``encode_batch`` runs in the library's threads.

  ``vocab_size`` counts the added tokens too. Special ids default to None;
  ``load_tokenizer`` fills them from the files beside ``tokenizer.json``.
  """

  def __init__(self, tokenizer, *, bos_id: int | None = None,
               eos_id: int | None = None, pad_id: int | None = None):
    self.tokenizer = tokenizer
    self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id

  @classmethod
  def from_file(cls, path: str, **special) -> "HFTokenizer":
    tokenizers = _import("tokenizers", "tokenizers")
    return cls(tokenizers.Tokenizer.from_file(path), **special)

  def token_to_id(self, token: str) -> int | None:
    return self.tokenizer.token_to_id(token)

  def encode(self, text: str) -> list[int]:
    return self.tokenizer.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self.tokenizer.encode_batch(
        list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self.tokenizer.decode([int(i) for i in ids],
                                 skip_special_tokens=True)

  def save(self, directory: str, *, special_tokens: bool = True) -> None:
    """Writes ``tokenizer.json`` into ``directory`` and, with
    ``special_tokens``, a ``tokenizer_config.json`` naming the tokens of
    the bos/eos/pad ids that are set (as a HF checkpoint does)."""
    os.makedirs(directory, exist_ok=True)
    self.tokenizer.save(os.path.join(directory, HF_FILE))
    if not special_tokens:
      return
    names = {f"{name}_token": self.tokenizer.id_to_token(index)
             for name, index in (("bos", self.bos_id), ("eos", self.eos_id),
                                 ("pad", self.pad_id)) if index is not None}
    with open(os.path.join(directory, SPECIAL_TOKEN_FILES[0]), "w") as f:
      json.dump(names, f, indent=2)


class SentencePieceTokenizer(_Base):
  """A SentencePiece model (``.model``); its own bos/eos/pad ids (-1 in
  the model is None) unless given."""

  def __init__(self, path: str, *, bos_id: int | None = None,
               eos_id: int | None = None, pad_id: int | None = None):
    sentencepiece = _import("sentencepiece", "sentencepiece")
    self.processor = sentencepiece.SentencePieceProcessor(model_file=path)
    self.vocab_size = self.processor.get_piece_size()

    def own(given, value):
      return given if given is not None else (value if value >= 0 else None)

    self.bos_id = own(bos_id, self.processor.bos_id())
    self.eos_id = own(eos_id, self.processor.eos_id())
    self.pad_id = own(pad_id, self.processor.pad_id())

  def token_to_id(self, token: str) -> int | None:
    index = self.processor.piece_to_id(token)
    unknown = self.processor.unk_id()
    return None if index == unknown and token != self.processor.id_to_piece(
        unknown) else index

  def encode(self, text: str) -> list[int]:
    return self.processor.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self.processor.encode(list(texts))

  def decode(self, ids: Iterable[int]) -> str:
    return self.processor.decode([int(i) for i in ids])


def train_bpe(texts: Iterable[str], vocab_size: int, *,
              special_tokens: Sequence[str] = ("<pad>", "<s>", "</s>"),
              limit_alphabet: int | None = None) -> HFTokenizer:
  """A byte-level BPE (GPT-2's pre-tokenizer and decoder) trained on
  ``texts`` with the ``tokenizers`` trainer; deterministic for the same
  texts.

  ``special_tokens`` take the first ids, in order; ids of ``<pad>``,
  ``<s>`` and ``</s>`` become ``pad_id``, ``bos_id`` and ``eos_id``. With
  ``limit_alphabet=None`` the alphabet is all 256 byte symbols, so every
  string round-trips (``vocab_size`` must then exceed 256 plus the special
  tokens); a smaller ``limit_alphabet`` keeps that many most frequent
  symbols and maps the others to ``<unk>`` (added to ``special_tokens``),
  for vocabularies below 256.
  """
  tokenizers = _import("tokenizers", "tokenizers")
  from tokenizers import decoders, models, pre_tokenizers, trainers
  special = list(special_tokens)
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
  if limit_alphabet is None:
    model = models.BPE()
    options = dict(initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    floor = BYTE_VOCAB + len(special)
    if vocab_size <= floor:
      raise ValueError(f"a BPE over all bytes needs vocab_size > {floor} "
                       f"(256 bytes and {len(special)} special tokens), got "
                       f"{vocab_size}; pass limit_alphabet for less")
  else:
    if "<unk>" not in special:
      special.append("<unk>")
    model = models.BPE(unk_token="<unk>")
    options = dict(limit_alphabet=limit_alphabet)
  tokenizer = tokenizers.Tokenizer(model)
  tokenizer.pre_tokenizer = byte_level
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                special_tokens=special,
                                show_progress=False, **options)
  tokenizer.train_from_iterator(texts, trainer=trainer)
  ids = {name: tokenizer.token_to_id(token) for name, token in
         (("pad_id", "<pad>"), ("bos_id", "<s>"), ("eos_id", "</s>"))}
  return HFTokenizer(tokenizer, **ids)


def _special_token_ids(directory: str, tokenizer) -> dict[str, int]:
  """``{"bos_id": ..., ...}`` from the files of ``SPECIAL_TOKEN_FILES``:
  ``<name>_token_id`` entries, or ``<name>_token`` strings (or
  ``{"content": ...}`` dicts) looked up in the tokenizer."""
  found: dict[str, int] = {}
  for filename in SPECIAL_TOKEN_FILES:
    path = os.path.join(directory, filename)
    if not os.path.isfile(path):
      continue
    with open(path) as f:
      data = json.load(f)
    for name in ("bos", "eos", "pad"):
      key = f"{name}_id"
      if key in found:
        continue
      value = data.get(f"{name}_token_id")
      if isinstance(value, list):
        value = value[0] if value else None
      if value is None:
        token = data.get(f"{name}_token")
        if isinstance(token, dict):
          token = token.get("content")
        if isinstance(token, str) and hasattr(tokenizer, "token_to_id"):
          value = tokenizer.token_to_id(token)
      if value is not None:
        if not isinstance(value, int) or not 0 <= value:
          raise ValueError(f"{path}: {name}_token_id must be a non-negative "
                           f"int, got {value!r}")
        found[key] = value
  return found


def load_tokenizer(path: str | None) -> Tokenizer:
  """The tokenizer at ``path``: ``"bytes"`` (or None) is ``ByteTokenizer``;
  a ``tokenizer.json`` or a SentencePiece ``.model`` file; or a directory
  holding ``tokenizer.json``, else ``tokenizer.model``, else exactly one
  ``*.model``. Special ids come from the JSON files beside it (see
  ``SPECIAL_TOKEN_FILES``), over a SentencePiece model's own."""
  if path is None or path == "bytes":
    return ByteTokenizer()
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    directory = path
    candidates = [os.path.join(path, name) for name in
                  (HF_FILE, SENTENCEPIECE_FILE)]
    found = [p for p in candidates if os.path.isfile(p)]
    if not found:
      found = sorted(glob.glob(os.path.join(path, "*.model")))
      if len(found) > 1:
        raise ValueError(f"{path} holds several .model files {found}; name "
                         "one")
    if not found:
      raise ValueError(f"{path} holds no tokenizer ({HF_FILE}, "
                       f"{SENTENCEPIECE_FILE} or *.model)")
    path = found[0]
  elif os.path.isfile(path):
    directory = os.path.dirname(path)
  else:
    raise ValueError(f"tokenizer {path!r} is neither 'bytes' nor a file or "
                     "directory")
  if path.endswith(".json"):
    tokenizer = HFTokenizer.from_file(path)
  elif path.endswith(".model"):
    tokenizer = SentencePieceTokenizer(path)
  else:
    raise ValueError(f"tokenizer files are {HF_FILE} or a SentencePiece "
                     f".model, got {path!r}")
  for name, value in _special_token_ids(directory, tokenizer).items():
    setattr(tokenizer, name, value)
  return tokenizer


def tokenizer_files(directory: str) -> list[str]:
  """The tokenizer files of a checkpoint directory (empty when it has no
  tokenizer): the model file ``load_tokenizer`` picks and the
  ``tokenizer_config.json`` and ``special_tokens_map.json`` beside it."""
  model = [os.path.join(directory, name) for name in
           (HF_FILE, SENTENCEPIECE_FILE)
           if os.path.isfile(os.path.join(directory, name))]
  model = model or sorted(glob.glob(os.path.join(directory, "*.model")))
  if not model:
    return []
  return model[:1] + [os.path.join(directory, name)
                      for name in SPECIAL_TOKEN_FILES[:2]
                      if os.path.isfile(os.path.join(directory, name))]


def check_vocab(tokenizer: Tokenizer, vocab_size: int) -> None:
  """Raises ``ValueError`` naming both sizes when a model of ``vocab_size``
  ids cannot embed every id of ``tokenizer``; a larger ``vocab_size`` is
  allowed (the extra ids are padding the tokenizer never produces)."""
  if vocab_size < tokenizer.vocab_size:
    raise ValueError(f"the model's vocab_size = {vocab_size} is smaller than "
                     f"the tokenizer's vocabulary of {tokenizer.vocab_size} "
                     f"({tokenizer!r}); set vocab_size >= "
                     f"{tokenizer.vocab_size}")


def token_bytes(tokenizer: Tokenizer, vocab_size: int | None = None
                ) -> np.ndarray:
  """``[vocab_size]`` int64: the UTF-8 bytes of text each id stands for.

  Bytes: 1 each. A byte-level ``tokenizer.json`` (GPT-2's alphabet, one
  symbol a byte): its token's symbols; a SentencePiece model: its piece
  with ``▁`` a space and ``<0xNN>`` one byte. Special ids (bos, eos,
  pad, added special tokens, control and unknown pieces) count 0, and so do
  the ids from ``tokenizer.vocab_size`` to ``vocab_size`` (a model's
  padding; default ``tokenizer.vocab_size``). Other tokenizers: the bytes
  of ``decode([id])``. With bytes and a byte-level BPE the counts of a
  text's ids add up to its UTF-8 length (a SentencePiece model's, up to
  what its normalisation changes), so a summed loss divided by them is a
  loss per byte of text, comparable across tokenizers.
  """
  vocab = tokenizer.vocab_size
  if vocab_size is None:
    vocab_size = vocab
  if vocab_size < vocab:
    raise ValueError(f"vocab_size = {vocab_size} is smaller than the "
                     f"tokenizer's vocabulary of {vocab}")
  counts = np.zeros(vocab_size, np.int64)
  if isinstance(tokenizer, ByteTokenizer):
    counts[:vocab] = 1
    return counts
  special = {i for i in (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)
             if i is not None}
  if isinstance(tokenizer, HFTokenizer):
    from tokenizers import decoders
    hf = tokenizer.tokenizer
    byte_level = isinstance(hf.decoder, decoders.ByteLevel)
    special |= {i for i, token in hf.get_added_tokens_decoder().items()
                if token.special}
    for i in range(vocab):
      if i not in special:
        counts[i] = (len(hf.id_to_token(i)) if byte_level else
                     len(tokenizer.decode([i]).encode("utf-8")))
    return counts
  if isinstance(tokenizer, SentencePieceTokenizer):
    sp = tokenizer.processor
    for i in range(vocab):
      if i in special or sp.is_control(i) or sp.is_unknown(i):
        continue
      counts[i] = 1 if sp.is_byte(i) else len(
          sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
    return counts
  for i in range(vocab):
    if i not in special:
      counts[i] = len(tokenizer.decode([i]).encode("utf-8"))
  return counts


class IncrementalDecoder:
  """Text of ids that arrive a few at a time, for streaming.

  ``push(ids)`` returns the text the ids so far add to what it returned
  before. The whole sequence is decoded every time (so a tokenizer whose
  pieces depend on their neighbours, such as SentencePiece's leading
  spaces, decodes as in one call), and text ending in U+FFFD, a character
  whose bytes have not all arrived, is held back until they do; ``flush``
  returns what is left.
  """

  def __init__(self, tokenizer: Tokenizer):
    self.tokenizer = tokenizer
    self.ids: list[int] = []
    self.emitted = 0

  def push(self, ids: Iterable[int]) -> str:
    self.ids.extend(int(i) for i in ids)
    text = self.tokenizer.decode(self.ids)
    if text.endswith("\ufffd"):
      return ""
    return self._take(text)

  def flush(self) -> str:
    return self._take(self.tokenizer.decode(self.ids))

  def _take(self, text: str) -> str:
    new = text[self.emitted:]
    self.emitted = max(self.emitted, len(text))
    return new
