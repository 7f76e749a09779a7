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
    if index < 0:
      raise ValueError(f"row index must be >= 0, got {index}")
    epoch, r = divmod(int(index), self.rows_per_epoch)
    order, ends = self._epoch(epoch)
    start, stop = r * self.row_tokens, (r + 1) * self.row_tokens
    first = int(np.searchsorted(ends, start, side="right"))
    tokens = np.empty(self.row_tokens, np.int32)
    segments = np.empty(self.row_tokens, np.int32)
    at, piece, j = start, 1, first
    while at < stop:
      doc = int(order[j])
      doc_start = int(ends[j]) - int(self.corpus.lengths[doc])
      take = min(int(ends[j]), stop) - at
      text = self.corpus.document(doc)[at - doc_start:at - doc_start + take]
      tokens[at - start:at - start + take] = text
      segments[at - start:at - start + take] = piece
      at, piece, j = at + take, piece + 1, j + 1
    return tokens, segments

  def rows(self, indices) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, segment_ids)``, each ``[len(indices), row_len + 1]``."""
    pairs = [self.row(i) for i in indices]
    return (np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs]))


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
  t = seg_in.shape[-1]
  index = np.broadcast_to(np.arange(t, dtype=np.int32), seg_in.shape)
  starts = np.concatenate(
      [np.ones(seg_in.shape[:-1] + (1,), bool),
       seg_in[..., 1:] != seg_in[..., :-1]], axis=-1)
  last_start = np.maximum.accumulate(np.where(starts, index, 0), axis=-1)
  return {
      "inputs": tokens[..., :-1],
      "targets": tokens[..., 1:],
      "segment_ids": seg_in,
      "weights": weights,
      "positions": (index - last_start).astype(np.int32),
  }
