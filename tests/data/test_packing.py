"""``model_inputs`` and ``PackedRows`` against plain loops: positions count
within each piece of a row, weights stop at document boundaries and
padding, and a batch of rows is the rows one by one."""

import numpy as np

from lin_attn_jax.data import PackedRows, model_inputs
from lin_attn_jax.data.corpus import Corpus


def test_model_inputs_match_a_loop():
  rng = np.random.default_rng(0)
  # Runs of segment ids, padding (0) included, with leading dimensions.
  segments = np.sort(rng.integers(0, 5, (2, 3, 23)), axis=-1)[..., ::-1]
  segments = np.ascontiguousarray(segments).astype(np.int32)
  segments[0, 0] = 7
  tokens = rng.integers(0, 256, segments.shape).astype(np.int32)
  batch = model_inputs(tokens, segments)
  for row in np.ndindex(segments.shape[:-1]):
    seg = segments[row]
    run = 0
    for t in range(seg.shape[0] - 1):
      run = 0 if t == 0 or seg[t] != seg[t - 1] else run + 1
      assert batch["positions"][row][t] == run
      assert batch["weights"][row][t] == float(seg[t] == seg[t + 1] != 0)
      assert batch["targets"][row][t] == tokens[row][t + 1]
      assert batch["inputs"][row][t] == tokens[row][t]
      assert batch["segment_ids"][row][t] == seg[t]
  assert all(v.shape == (2, 3, 22) for v in batch.values())
  assert batch["positions"].dtype == np.int32


def test_rows_are_the_stream_cut_into_rows():
  rng = np.random.default_rng(1)
  lengths = rng.integers(1, 30, 40)
  tokens = rng.integers(0, 256, int(lengths.sum())).astype(np.uint8)
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
  corpus = Corpus("test", tokens, starts, lengths, 256)
  rows = PackedRows(corpus, 10, seed=2)
  for epoch in range(2):
    order, _ = rows._epoch(epoch)
    stream = np.concatenate([corpus.document(d) for d in order])
    pieces = np.concatenate([np.full(lengths[d], i) for i, d in
                             enumerate(order)])
    indices = [epoch * rows.rows_per_epoch + r
               for r in range(rows.rows_per_epoch)]
    got, segments = rows.rows(indices)
    for r, index in enumerate(indices):
      want = stream[r * 11:(r + 1) * 11]
      np.testing.assert_array_equal(got[r], want)
      np.testing.assert_array_equal(rows.row(index)[0], want)
      # Segment ids number the documents' pieces of the row from 1.
      part = pieces[r * 11:(r + 1) * 11]
      np.testing.assert_array_equal(segments[r],
                                    np.unique(part, return_inverse=True)[1]
                                    + 1)
