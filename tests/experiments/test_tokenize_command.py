"""experiments.tokenize: its shards read back as the corpus's documents,
and a rerun resumes from the manifest."""

import json
import os

import numpy as np
import pytest

from experiments import tokenize
from experiments.config_flags import FlagError
from experiments.configs.base import parse_data
from lin_attn_jax.data import array_record_corpus, jsonl_corpus
from lin_attn_jax.data import ByteTokenizer, token_file_corpus, train_bpe

TEXTS = [f"line {i} ünïcode ✓ " * (i % 5 + 1) for i in range(30)]


def write_jsonl(folder):
  for part in range(3):
    with open(folder / f"c-{part}.jsonl", "w") as f:
      for text in TEXTS[part * 10:(part + 1) * 10]:
        f.write(json.dumps({"body": text}) + "\n")
  return f"jsonl:{folder}/*.jsonl,text_field=body"


@pytest.mark.parametrize("fmt", ["array_record", "bin"])
def test_shards_read_back_and_a_rerun_resumes(tmp_path, fmt):
  data = write_jsonl(tmp_path)
  out = tmp_path / "out"
  config = tokenize.TokenizeConfig(data=data, out_dir=str(out), format=fmt,
                                   workers=2)
  manifest = tokenize.tokenize(config)
  assert sorted(manifest["shards"]) == ["0", "1", "2"]
  assert sum(s["documents"] for s in manifest["shards"].values()) == 30
  expected = jsonl_corpus(str(tmp_path / "*.jsonl"), ByteTokenizer(),
                          text_field="body", split="train",
                          heldout_fraction=0.2)
  if fmt == "array_record":
    back = array_record_corpus(str(out / "*.array_record"), dtype="uint16",
                               vocab_size=256, split="train",
                               heldout_fraction=0.2)
    np.testing.assert_array_equal(back.tokens, expected.tokens)
    np.testing.assert_array_equal(back.lengths, expected.lengths)
  else:
    first = token_file_corpus(str(out / "shard-00000.bin"), dtype="uint16",
                              vocab_size=256, split="all")
    assert [bytes(first.document(i).tolist()).decode()
            for i in range(first.num_documents)] == TEXTS[:10]

  os.remove(out / f"shard-00001{tokenize.FORMATS[fmt]}")
  del manifest["shards"]["1"]
  tokenize.write_manifest(config, manifest)
  stamps = {n: os.stat(out / f"shard-0000{n}{tokenize.FORMATS[fmt]}")
            .st_mtime_ns for n in (0, 2)}
  # An input that changed since its shard was written: that shard again.
  with open(tmp_path / "c-2.jsonl", "a") as f:
    f.write(json.dumps({"body": "one more"}) + "\n")
  again = tokenize.tokenize(config)
  assert sorted(again["shards"]) == ["0", "1", "2"]
  assert os.stat(out / f"shard-00000{tokenize.FORMATS[fmt]}"
                 ).st_mtime_ns == stamps[0]
  assert os.stat(out / f"shard-00002{tokenize.FORMATS[fmt]}"
                 ).st_mtime_ns != stamps[2]
  assert again["shards"]["2"]["documents"] == 11
  assert os.path.exists(out / f"shard-00001{tokenize.FORMATS[fmt]}")
  with pytest.raises(ValueError, match="was written with"):
    tokenize.tokenize(tokenize.TokenizeConfig(
        data=data, out_dir=str(out), format=fmt, files_per_shard=2))


def test_a_tokenizer_retrained_in_place_is_refused(tmp_path):
  data = write_jsonl(tmp_path)
  train_bpe(TEXTS, 280).save(str(tmp_path / "bpe"))
  config = tokenize.TokenizeConfig(data=data, out_dir=str(tmp_path / "out"),
                                   tokenizer=str(tmp_path / "bpe"))
  os.makedirs(config.out_dir)
  tokenize.write_manifest(config, tokenize.read_manifest(config, "uint16"))
  tokenize.read_manifest(config, "uint16")
  train_bpe(TEXTS[:10], 270).save(str(tmp_path / "bpe"))
  with pytest.raises(ValueError, match="was written with"):
    tokenize.tokenize(config)


def test_bad_settings():
  with pytest.raises(FlagError, match="required"):
    tokenize.tokenize(tokenize.PRESETS["default"])
  with pytest.raises(ValueError, match="text, jsonl or parquet"):
    tokenize.TokenizeConfig(data="arrayrecord:x/*.array_record")
  with pytest.raises(ValueError, match="format must be"):
    tokenize.TokenizeConfig(data="jsonl:x", format="csv")


def test_data_specs():
  assert parse_data("jsonl:a/*.jsonl,b.jsonl,text_field=body") == (
      "jsonl", ["a/*.jsonl", "b.jsonl"], {"text_field": "body"})
  assert parse_data("parquet:p/*.parquet,skip_bad_records=true") == (
      "parquet", ["p/*.parquet"], {"skip_bad_records": True})
  assert parse_data("arrayrecord:s/*,dtype=uint16,vocab_size=300") == (
      "arrayrecord", ["s/*"], {"dtype": "uint16", "vocab_size": 300})
  for bad, message in (("jsonl:a,dtype=uint16", "is not one of"),
                       ("jsonl:text_field=x", "names no file pattern"),
                       ("arrayrecord:s,vocab_size=x", "is not an int"),
                       ("parquet:p,skip_bad_records=1", "true or false"),
                       ("csv:x", "data must be")):
    with pytest.raises(ValueError, match=message):
      parse_data(bad)
