"""Rows for the encoder tasks: classification examples and masked tokens.

Both are row sources as ``PackedRows`` is (``row_len``, ``rows_per_epoch``,
``seed``, ``corpus`` with ``name`` and ``fingerprint()``, and
``batch(indices)``: the step's arrays, a pure function of the global row
indices), so ``pipeline.BatchSource`` and ``train.loop.fit`` read them the
same way, on any mesh and across a resume.

- ``ExampleRows``: a random-access labelled source (``lra.ListOps``,
  ``lra.Pathfinder``, ``SyntheticClassification``), its examples in a new
  order every epoch (drawn from ``(seed, epoch)``): ``inputs`` and
  ``segment_ids`` ``[N, T]`` (or ``inputs [N, res, res, 1]`` images with
  ``images=True``), ``targets`` (the labels) and ``weights`` (ones)
  ``[N]``.
- ``MaskedRows``: packed rows of a corpus with BERT's masking
  (``mask_tokens``): ``inputs`` (masked), ``targets`` (the original
  tokens), ``weights`` (1 on the masked positions only), ``segment_ids``,
  ``[N, T]``.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from lin_attn_jax.data.packing import PackedRows, _piece_positions
from lin_attn_jax.ops.common import checks


@dataclasses.dataclass(frozen=True)
class SourceName:
  """What ``data_record`` reads of a source: its name and fingerprint."""

  name: str
  digest: str

  def fingerprint(self) -> str:
    return self.digest


def mask_tokens(tokens, segment_ids, rng: np.random.Generator, *,
                vocab_size: int, mask_id: int, rate: float = 0.15) -> dict:
  """BERT's masking (Devlin et al. 2019) of ``tokens [N, T]``.

  Each token whose segment id is not 0 is selected with probability
  ``rate``; a selected token becomes ``mask_id`` with probability 0.8, a
  uniform id in ``[0, vocab_size)`` with 0.1, and stays with 0.1. Returns
  ``inputs`` (int32), ``targets`` (the original tokens), ``weights``
  (float32, 1 where selected: the loss is on those alone), ``segment_ids``
  and ``positions``, each ``[N, T]``.
  """
  tokens = np.asarray(tokens, np.int32)
  segment_ids = np.asarray(segment_ids, np.int32)
  selected = (rng.random(tokens.shape) < rate) & (segment_ids != 0)
  draw = rng.random(tokens.shape)
  random_ids = rng.integers(0, vocab_size, tokens.shape, dtype=np.int32)
  inputs = np.where(selected & (draw < 0.8), mask_id, tokens)
  inputs = np.where(selected & (draw >= 0.8) & (draw < 0.9), random_ids,
                    inputs)
  return {"inputs": inputs.astype(np.int32), "targets": tokens,
          "weights": selected.astype(np.float32),
          "segment_ids": segment_ids,
          "positions": _piece_positions(segment_ids)}


class MaskedRows:
  """Rows of ``row_len`` tokens of ``packed`` (a ``PackedRows`` of the
  same ``row_len``), masked by ``mask_tokens`` with a generator drawn from
  ``(seed, row index)``."""

  def __init__(self, packed: PackedRows, *, vocab_size: int,
               mask_id: int | None = None, rate: float = 0.15):
    if not 0 < rate < 1:
      raise ValueError(f"rate must be in (0, 1), got {rate!r}")
    self.packed, self.rate = packed, rate
    self.vocab_size = vocab_size
    self.mask_id = vocab_size if mask_id is None else mask_id
    self.row_len, self.seed = packed.row_len, packed.seed
    self.rows_per_epoch = packed.rows_per_epoch
    self.corpus = SourceName(f"{packed.corpus.name} (masked {rate})",
                             packed.corpus.fingerprint())

  def batch(self, indices) -> dict:
    indices = [int(i) for i in indices]
    tokens, segments = self.packed.rows(indices)
    tokens, segments = tokens[:, :-1], segments[:, :-1]         # [N, T]
    rows = [mask_tokens(tokens[i:i + 1], segments[i:i + 1],
                        np.random.default_rng([self.seed, 1, index]),
                        vocab_size=self.vocab_size, mask_id=self.mask_id,
                        rate=self.rate)
            for i, index in enumerate(indices)]
    return {key: np.concatenate([row[key] for row in rows])
            for key in rows[0]}


class ExampleRows:
  """A labelled example source as training rows; see the module docstring.

  Args:
    dataset: ``len``, ``seq_len``, ``num_classes`` and ``batch(indices)``
      returning ``inputs``, ``segment_ids`` and ``labels``.
    seed: seeds the order of every epoch.
    name: what checkpoints record (default the dataset's class name).
    images: return ``inputs`` as ``[N, res, res, 1]`` images (for
      ``ViT``; ``seq_len`` must be a square) and no ``segment_ids``.
  """

  def __init__(self, dataset, *, seed: int = 0, name: str | None = None,
               images: bool = False):
    if len(dataset) < 1:
      raise ValueError("dataset has no examples")
    self.dataset, self.seed, self.images = dataset, seed, images
    self.row_len = dataset.seq_len
    self.rows_per_epoch = len(dataset)
    if images:
      self.resolution = int(round(self.row_len ** 0.5))
      if self.resolution ** 2 != self.row_len:
        raise ValueError(f"images=True needs a square seq_len, got "
                         f"{self.row_len}")
    name = name or type(dataset).__name__
    key = repr((name, len(dataset), getattr(dataset, "key", None),
                self.row_len))
    self.corpus = SourceName(name, hashlib.sha256(key.encode()).hexdigest())
    self._orders: dict[int, np.ndarray] = {}

  def _order(self, epoch: int) -> np.ndarray:
    if epoch not in self._orders:
      if len(self._orders) >= 2:
        self._orders.pop(min(self._orders))
      rng = np.random.default_rng([self.seed, epoch])
      self._orders[epoch] = rng.permutation(self.rows_per_epoch)
    return self._orders[epoch]

  def batch(self, indices) -> dict:
    indices = [int(i) for i in indices]
    examples = [self._order(i // self.rows_per_epoch)[i % self.rows_per_epoch]
                for i in indices]
    arrays = self.dataset.batch(examples)
    out = {"inputs": arrays["inputs"],
           "targets": arrays["labels"].astype(np.int32),
           "weights": np.ones(len(indices), np.float32)}
    if self.images:
      out["inputs"] = out["inputs"].reshape(
          len(indices), self.resolution, self.resolution, 1)
    else:
      out["segment_ids"] = arrays["segment_ids"]
      out["positions"] = arrays["positions"]
    return out


class SyntheticClassification:
  """A tiny classification task for tests and smoke runs.

  Example ``i`` (a pure function of ``(seed, i)``) has a label ``y`` in
  ``[0, num_classes)`` and a length uniform in ``[seq_len // 2, seq_len]``;
  each token is ``1 + y`` with probability ``signal``, else uniform in
  ``[1, vocab_size)``; the rest is padding (0, segment id 0). So ``1 + y``
  is the example's most likely token, and counting over the whole sequence
  (mean pooling) tells the label with high probability.
  """

  def __init__(self, num_examples: int, *, seq_len: int = 32,
               vocab_size: int = 16, num_classes: int = 4, seed: int = 0,
               signal: float = 0.3):
    for name, value in (("num_examples", num_examples), ("seq_len", seq_len),
                        ("num_classes", num_classes)):
      checks.positive_int(name, value)
    if vocab_size <= num_classes:
      raise ValueError(f"vocab_size {vocab_size} must exceed num_classes "
                       f"{num_classes}")
    self.num_examples, self.seq_len = num_examples, seq_len
    self.vocab_size, self.num_classes = vocab_size, num_classes
    self.signal, self.key = signal, (int(seed),)

  def __len__(self) -> int:
    return self.num_examples

  def batch(self, indices) -> dict:
    n, t = len(indices), self.seq_len
    tokens = np.zeros((n, t), np.int32)
    lengths = np.zeros(n, np.int64)
    labels = np.zeros(n, np.int32)
    for row, index in enumerate(indices):
      rng = np.random.default_rng([*self.key, int(index)])
      label = rng.integers(self.num_classes)
      length = rng.integers(max(t // 2, 1), t + 1)
      ids = rng.integers(1, self.vocab_size, length)
      ids = np.where(rng.random(length) < self.signal, 1 + label, ids)
      tokens[row, :length], lengths[row], labels[row] = ids, length, label
    valid = np.arange(t)[None] < lengths[:, None]
    return {"inputs": tokens, "segment_ids": valid.astype(np.int32),
            "positions": np.where(valid, np.arange(t)[None], 0).astype(
                np.int32),
            "labels": labels}
