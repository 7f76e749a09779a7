"""Documents packed into fixed-length rows, as a pure function of the row.

Epoch ``e`` orders the documents by a permutation drawn from ``(seed, e)``,
concatenates them into one stream and cuts it into rows of ``T + 1``
tokens (concatenate-then-split: no padding, and a document longer than a
row continues in the next one). Row ``r`` of epoch ``e`` is global row
``e * rows_per_epoch + r``; each row carries ``segment_ids`` (1, 2, ... for
the pieces of documents in it), so every recurrent state, convolution and
attention resets between documents.

Random access (``row(i)`` costs a binary search) is what makes a batch a
pure function of ``(seed, step)``: resuming, or changing the number of
devices or processes, reads the same rows. grain's packers
(``FirstFitPackIterDataset``, ``ConcatThenSplitIterDataset``) are
iterators: row ``i`` is known only after rows ``0 .. i - 1`` were packed,
so a process that reads only its own rows, or a resumed run, would have to
replay the stream (or restore an iterator state saved by the same process
layout). The packing here is the concatenate-then-split of
``ConcatThenSplitIterDataset`` made random-access; grain serves the
per-step source and the read-ahead (``pipeline.py``).
"""

from __future__ import annotations

import numpy as np

from lin_attn_jax.data.corpus import Corpus
from lin_attn_jax.ops.common import checks


class PackedRows:
  """Rows of ``row_len + 1`` tokens from ``corpus``; see the module doc."""

  def __init__(self, corpus: Corpus, row_len: int, seed: int = 0):
    checks.positive_int("row_len", row_len)
    self.corpus, self.row_len, self.seed = corpus, row_len, seed
    self.row_tokens = row_len + 1
    self.rows_per_epoch = corpus.num_tokens // self.row_tokens
    if self.rows_per_epoch < 1:
      raise ValueError(f"corpus {corpus.name} has {corpus.num_tokens} tokens, "
                       f"fewer than one row of {self.row_tokens}")
    self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

  def _epoch(self, epoch: int):
    """The document order of ``epoch`` and the stream offset where each
    ends (the last two epochs are kept)."""
    if epoch not in self._epochs:
      rng = np.random.default_rng([self.seed, epoch])
      order = rng.permutation(self.corpus.num_documents)
      ends = np.cumsum(self.corpus.lengths[order])             # [n_docs]
      if len(self._epochs) >= 2:
        self._epochs.pop(min(self._epochs))
      self._epochs[epoch] = (order, ends)
    return self._epochs[epoch]

  def row(self, index: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, segment_ids)``, each ``[row_len + 1]`` int32."""
    tokens = np.empty(self.row_tokens, np.int32)
    segments = np.empty(self.row_tokens, np.int32)
    self._fill(index, tokens, segments)
    return tokens, segments

  def rows(self, indices) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, segment_ids)``, each ``[len(indices), row_len + 1]``."""
    indices = list(indices)
    tokens = np.empty((len(indices), self.row_tokens), np.int32)
    segments = np.empty((len(indices), self.row_tokens), np.int32)
    for i, index in enumerate(indices):
      self._fill(index, tokens[i], segments[i])
    return tokens, segments

  def batch(self, indices) -> dict:
    """``model_inputs`` of rows ``indices``: ``[len(indices), row_len]``
    arrays (the interface of a row source, ``pipeline.BatchSource``)."""
    return model_inputs(*self.rows(indices))

  def _fill(self, index: int, tokens: np.ndarray,
            segments: np.ndarray) -> None:
    """Writes row ``index`` into ``tokens`` and ``segments``
    (``[row_len + 1]`` each)."""
    if index < 0:
      raise ValueError(f"row index must be >= 0, got {index}")
    epoch, r = divmod(int(index), self.rows_per_epoch)
    order, ends = self._epoch(epoch)
    start, stop = r * self.row_tokens, (r + 1) * self.row_tokens
    j = int(np.searchsorted(ends, start, side="right"))
    corpus_tokens, starts = self.corpus.tokens, self.corpus.starts
    lengths = self.corpus.lengths
    at, piece = start, 1
    while at < stop:
      doc = order[j]
      end = int(ends[j])
      take = min(end, stop) - at
      offset = int(starts[doc]) + at - (end - int(lengths[doc]))
      tokens[at - start:at - start + take] = corpus_tokens[offset:
                                                           offset + take]
      segments[at - start:at - start + take] = piece
      at, piece, j = at + take, piece + 1, j + 1


def model_inputs(tokens: np.ndarray, segment_ids: np.ndarray) -> dict:
  """The arrays a training step reads, from rows of ``T + 1`` tokens.

  Returns a dict of ``[..., T]`` arrays: ``inputs`` (int32),
  ``segment_ids`` (int32, 0 marks padding), ``targets`` (the next token),
  ``weights`` (float32, 1 where the target is the next token of the same
  document, 0 across a document boundary and on padding) and ``positions``
  (int32, the index of each input in its document piece).
  """
  tokens = np.asarray(tokens, np.int32)
  segment_ids = np.asarray(segment_ids, np.int32)
  if tokens.shape != segment_ids.shape or tokens.shape[-1] < 2:
    raise ValueError(f"tokens {tokens.shape} and segment_ids "
                     f"{segment_ids.shape} must have equal shapes [..., T+1] "
                     "with T >= 1")
  seg_in, seg_next = segment_ids[..., :-1], segment_ids[..., 1:]
  weights = ((seg_in == seg_next) & (seg_next != 0)).astype(np.float32)
  return {
      "inputs": tokens[..., :-1],
      "targets": tokens[..., 1:],
      "segment_ids": seg_in,
      "weights": weights,
      "positions": _piece_positions(seg_in),
  }


def _piece_positions(segment_ids: np.ndarray) -> np.ndarray:
  """``[..., T]`` int32: the index of each token in its run of equal
  segment ids (runs restart at every row). Computed over the flattened
  rows: each token's index minus the index where its run starts (with a
  cumulative maximum along the rows ``model_inputs`` took 2.5 times as
  long, docs/performance.md)."""
  flat = np.ascontiguousarray(segment_ids).reshape(-1)         # [N]
  if not flat.size:
    return np.zeros(segment_ids.shape, np.int32)
  starts = np.empty(flat.size, bool)
  starts[0] = True
  np.not_equal(flat[1:], flat[:-1], out=starts[1:])
  starts[::segment_ids.shape[-1]] = True
  first = np.flatnonzero(starts)                               # [runs]
  lengths = np.diff(np.append(first, flat.size))
  positions = np.arange(flat.size) - np.repeat(first, lengths)
  return positions.astype(np.int32).reshape(segment_ids.shape)
