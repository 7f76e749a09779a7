"""jsonl, parquet and ArrayRecord corpora: the same documents give the same
batches on any mesh and after a resume; bad records name file and line."""

import json

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lin_attn_jax import sharding as shd
from lin_attn_jax.data import (BatchSource, PackedRows, array_record_corpus,
                               global_batch_to_device, jsonl_corpus,
                               parquet_corpus, sources)
from lin_attn_jax.data import corpus as corpus_lib
from lin_attn_jax.data.pipeline import process_rows

TEXTS = [f"document {i}: " + "héllo wörld ✓ " * (i % 7 + 1) + "\n" * (i % 3)
         for i in range(60)]


class ShiftedBytes:
  """A stand-in tokenizer: UTF-8 bytes + 1, eos 0 (257 ids)."""

  vocab_size = 257
  eos_id = 0

  def encode_batch(self, texts):
    return [[b + 1 for b in text.encode("utf-8")] for text in texts]


def write_all_formats(folder, texts=TEXTS):
  """The texts as two jsonl shards, one parquet file and two ArrayRecord
  shards with indices; returns the three patterns."""
  for part, chunk in enumerate((texts[:25], texts[25:])):
    with open(folder / f"part-{part}.jsonl", "w") as f:
      for text in chunk:
        f.write(json.dumps({"id": 7, "text": text}) + "\n")
  pq.write_table(pa.table({"text": texts}), folder / "all.parquet",
                 row_group_size=16)
  tokenizer = ShiftedBytes()
  for part, chunk in enumerate((texts[:40], texts[40:])):
    docs = [np.array(ids + [0]) for ids in tokenizer.encode_batch(chunk)]
    shard = str(folder / f"shard-{part}.array_record")
    sources.write_array_record(shard, docs, "uint16")
    corpus_lib.write_index(
        corpus_lib.index_path(shard), np.array([len(d) for d in docs]),
        np.array([corpus_lib.document_key(t.encode()) for t in chunk],
                 np.uint64))
  return (str(folder / "*.jsonl"), str(folder / "*.parquet"),
          str(folder / "*.array_record"))


def corpora(patterns, split, **kwargs):
  jsonl, parquet, array_record = patterns
  return [jsonl_corpus(jsonl, ShiftedBytes(), split=split, **kwargs),
          parquet_corpus(parquet, ShiftedBytes(), split=split, **kwargs),
          array_record_corpus(array_record, dtype="uint16", vocab_size=257,
                              split=split, **kwargs)]


def test_documents_and_split_agree_across_formats(tmp_path):
  patterns = write_all_formats(tmp_path)
  every = corpora(patterns, "all")
  expected = [[b + 1 for b in t.encode()] + [0] for t in TEXTS]
  for corpus in every:
    assert [corpus.document(i).tolist()
            for i in range(corpus.num_documents)] == expected
    assert corpus.vocab_size == 257
  train = corpora(patterns, "train", heldout_fraction=0.2)
  held = corpora(patterns, "heldout", heldout_fraction=0.2)
  assert 0 < held[0].num_documents < train[0].num_documents
  assert train[0].num_documents + held[0].num_documents == len(TEXTS)
  for corpus in train[1:]:
    np.testing.assert_array_equal(corpus.tokens, train[0].tokens)
    np.testing.assert_array_equal(corpus.lengths, train[0].lengths)
  keys = {corpus_lib.document_key(t.encode()): t for t in TEXTS}
  held_texts = {t for k, t in keys.items()
                if corpus_lib.key_in_split(k, "heldout", 0.2)}
  assert {bytes(x - 1 for x in held[0].document(i)[:-1]).decode()
          for i in range(held[0].num_documents)} == held_texts


def test_batches_agree_across_formats_meshes_and_resume(tmp_path):
  patterns = write_all_formats(tmp_path)
  train = corpora(patterns, "train", heldout_fraction=0.1)
  batch, steps = 8, 6
  mesh = shd.make_mesh("data=8", jax.devices()[:8])
  positions = process_rows(mesh, batch)
  reference = None
  for corpus in train:
    source = BatchSource(PackedRows(corpus, 15, seed=3), batch)
    batches = [source.batch(s) for s in range(steps)]
    streamed = list(source.iterator(0, steps))
    resumed = list(BatchSource(PackedRows(corpus, 15, seed=3),
                               batch).iterator(4, steps))
    for s in range(steps):
      for name, value in batches[s].items():
        np.testing.assert_array_equal(streamed[s][name], value)
        if s >= 4:
          np.testing.assert_array_equal(resumed[s - 4][name], value)
    local = BatchSource(PackedRows(corpus, 15, seed=3), batch,
                        positions).batch(2)
    on_mesh = global_batch_to_device(local, positions, mesh, batch)
    for name, value in batches[2].items():
      np.testing.assert_array_equal(np.asarray(on_mesh[name]), value)
    if reference is None:
      reference = batches
      assert len({tuple(b["inputs"].ravel()) for b in batches}) == steps
    for got, want in zip(batches, reference):
      for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def bad_jsonl(tmp_path, lines):
  path = tmp_path / "bad.jsonl"
  path.write_bytes(b"\n".join(lines) + b"\n")
  return str(path)


@pytest.mark.parametrize("line, message", [
    (b'{"text": "caf\xe9"}', "line 2: not UTF-8"),
    (b'{"text": "unterminated', "line 2: not JSON"),
    (b'["text"]', "line 2: not a JSON object"),
    (b'{"body": "x"}', "line 2: no field 'text'"),
    (b'{"text": 3}', "line 2: field 'text' is int"),
])
def test_bad_jsonl_lines_name_file_and_line(tmp_path, line, message,
                                            caplog):
  path = bad_jsonl(tmp_path, [b'{"text": "good"}', line,
                              b'{"text": "also good"}'])
  with pytest.raises(ValueError, match=f"{path}, {message}"):
    jsonl_corpus(path, ShiftedBytes(), split="all")
  corpus = jsonl_corpus(path, ShiftedBytes(), split="all",
                        skip_bad_records=True)
  assert corpus.num_documents == 2
  assert "skipped 1 bad records" in caplog.text


def test_other_bad_inputs_name_what_is_wrong(tmp_path):
  with pytest.raises(ValueError, match="no file matches"):
    jsonl_corpus(str(tmp_path / "*.jsonl"), ShiftedBytes())
  pq.write_table(pa.table({"body": ["x"]}), tmp_path / "t.parquet")
  with pytest.raises(ValueError, match=r"t\.parquet: no column 'text' "
                     r"\(columns: 'body'\)"):
    parquet_corpus(str(tmp_path / "t.parquet"), ShiftedBytes())
  assert parquet_corpus(str(tmp_path / "t.parquet"), ShiftedBytes(),
                        text_field="body", split="all").num_documents == 1
  pq.write_table(pa.table({"text": [b"ok", b"caf\xe9"]}),
                 tmp_path / "b.parquet")
  with pytest.raises(ValueError, match=r"b\.parquet, row 2: column 'text' "
                     "is not UTF-8"):
    parquet_corpus(str(tmp_path / "b.parquet"), ShiftedBytes())
  shard = str(tmp_path / "s.array_record")
  sources.write_array_record(shard, [np.array([1, 2]), np.array([3, 300])],
                             "uint16")
  with pytest.raises(ValueError, match=r"s\.array_record, record 1: token "
                     "id 300 is outside the vocabulary of 257 ids"):
    array_record_corpus(shard, dtype="uint16", vocab_size=257, split="all")
  sources.write_array_record(shard, [np.array([1, 2, 3])], "uint16")
  with pytest.raises(ValueError, match=r"record 0: 6 bytes is not a whole "
                     "number of uint32"):
    array_record_corpus(shard, dtype="uint32", split="all")

  class Wide(ShiftedBytes):
    vocab_size = 100

  path = bad_jsonl(tmp_path, [b'{"text": "z"}'])
  with pytest.raises(ValueError, match=f"{path}, line 1: token id 123 is "
                     "outside the vocabulary of 100 ids"):
    jsonl_corpus(path, Wide(), split="all")
