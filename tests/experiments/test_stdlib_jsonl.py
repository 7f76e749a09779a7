"""The path of ``make run-bpe`` at a very small size: source files as jsonl
shards and a BPE trained on their training split
(``experiments.stdlib_jsonl``), token shards (``experiments.tokenize``), a
training run with the BPE that reports held-out bits per byte, and
``experiments.evaluate`` reproducing that number from the workdir."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from experiments import evaluate, stdlib_jsonl, tokenize, workdirs
from lin_attn_jax.data import (ByteTokenizer, jsonl_corpus, load_tokenizer,
                               train_bpe)
from lin_attn_jax.data import corpus as corpus_lib
from tests.experiments.test_train_command import ok, records, train

FRACTION = 0.2


def write_sources(folder, n=40):
  """``n`` small Python files (some non-ASCII), one that is not UTF-8 and
  an empty one; returns the texts of the UTF-8 ones by relative path."""
  texts = {}
  for i in range(n):
    name = f"pkg{i % 3}/mod_{i:02d}.py"
    texts[name] = (f'"""Module {i}: café ✓."""\n\n'
                   + "".join(f"def f{j}(x):\n  return x * {i + j}  # ∑\n\n"
                             for j in range(i % 5 + 2)))
  for name, text in texts.items():
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
  (folder / "latin1.py").write_bytes(b"# caf\xe9\n")
  (folder / "empty.py").write_bytes(b"")
  return texts


def test_shards_hold_the_files_and_the_bpe_sees_training_text_only(
    tmp_path, monkeypatch):
  texts = write_sources(tmp_path / "src")
  seen = []

  def recording_bpe(documents, vocab_size):
    seen.extend(documents)
    return train_bpe(documents, vocab_size)

  monkeypatch.setattr(stdlib_jsonl, "train_bpe", recording_bpe)
  config = stdlib_jsonl.StdlibJsonlConfig(
      out_dir=str(tmp_path / "out"), root=str(tmp_path / "src"), shards=3,
      vocab_size=300, heldout_fraction=FRACTION)
  said = []
  stdlib_jsonl.prepare(config, say=said.append)
  assert "40 documents" in said[0] and "1 files that are not UTF-8" in said[0]
  shards = sorted(os.listdir(tmp_path / "out" / "jsonl"))
  assert shards == [f"part-0000{i}.jsonl" for i in range(3)]
  lines = [json.loads(line) for shard in shards
           for line in open(tmp_path / "out" / "jsonl" / shard)]
  assert [(r["path"], r["text"]) for r in lines] == sorted(texts.items())
  train_texts = {t for t in texts.values() if corpus_lib.key_in_split(
      corpus_lib.document_key(t.encode()), "train", FRACTION)}
  assert 0 < len(train_texts) < len(texts)
  assert set(seen) == train_texts and len(seen) == len(train_texts)
  # The reader's training split is the BPE's text.
  corpus = jsonl_corpus(str(tmp_path / "out" / "jsonl" / "*.jsonl"),
                        ByteTokenizer(), heldout_fraction=FRACTION)
  assert {bytes(corpus.document(i)).decode()
          for i in range(corpus.num_documents)} == train_texts
  tokenizer = load_tokenizer(str(tmp_path / "out" / "tokenizer"))
  assert tokenizer.vocab_size == 300 and tokenizer.eos_id == 2
  # A rerun with the same settings keeps the files; other settings
  # rewrite them.
  stdlib_jsonl.prepare(config, say=said.append)
  assert said[-1].endswith("kept")
  stdlib_jsonl.prepare(dataclasses.replace(config, shards=2, vocab_size=0),
                       say=said.append)
  assert sorted(os.listdir(tmp_path / "out" / "jsonl")) == [
      "part-00000.jsonl", "part-00001.jsonl"]


def test_bpe_run_reports_bits_per_byte_that_evaluate_reproduces(tmp_path):
  write_sources(tmp_path / "src")
  out = tmp_path / "data"
  stdlib_jsonl.prepare(stdlib_jsonl.StdlibJsonlConfig(
      out_dir=str(out), root=str(tmp_path / "src"), shards=2,
      vocab_size=300, heldout_fraction=FRACTION), say=lambda _: None)
  jsonl = f"jsonl:{out}/jsonl/*.jsonl"
  tokenize.tokenize(tokenize.TokenizeConfig(
      data=jsonl, tokenizer=str(out / "tokenizer"),
      out_dir=str(out / "tokens"), workers=1))
  shards = f"arrayrecord:{out}/tokens/*.array_record,dtype=uint16"
  run = tmp_path / "run"
  text = ok(train(run, f"--config.data={shards}",
                  f"--config.tokenizer={out / 'tokenizer'}",
                  "--config.model.vocab_size=320",
                  f"--config.heldout_fraction={FRACTION}",
                  "--config.train.steps=2"))
  assert "step 2: held-out " in text and " bits/byte (" in text
  assert " bits/token, loss " in text
  final = [r for r in records(run) if "eval_loss" in r][-1]
  assert final["step"] == 2
  # BPE tokens stand for several bytes each.
  assert final["eval_bytes"] > 2 * final["eval_tokens"]
  # The workdir holds the tokenizer; evaluate reads it and, on the
  # training loop's held-out rows (from the jsonl shards or the token
  # shards), gets its numbers.
  assert load_tokenizer(str(run)).vocab_size == 300
  for data in (jsonl, shards):
    got = evaluate.evaluate(evaluate.EvaluateConfig(
        workdir=str(run), data=data, heldout_fraction=FRACTION, seq_len=16,
        batch_size=8, batches=1))["perplexity"]
    assert got["bytes"] == final["eval_bytes"]
    assert got["bits_per_byte"] == pytest.approx(final["eval_bits_per_byte"],
                                                 rel=1e-5)
    assert got["nats_per_token"] == pytest.approx(final["eval_loss"],
                                                  rel=1e-5)


def test_export_tokenizer_keeps_the_special_ids(tmp_path):
  """A tokenizer.json whose ids come from a config.json beside it (as in a
  HF checkpoint) keeps them in the workdir, whose config.json is the
  model's."""
  source = tmp_path / "hf"
  bpe = train_bpe([f"text {i} ✓" for i in range(50)], 280)
  bpe.save(str(source), special_tokens=False)
  (source / "config.json").write_text(json.dumps({"bos_token_id": 1,
                                                  "eos_token_id": 2}))
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"vocab_size": 300}))
  workdirs.export_tokenizer(str(source / "tokenizer.json"), str(workdir))
  copied = load_tokenizer(str(workdir))
  assert (copied.vocab_size, copied.bos_id, copied.eos_id,
          copied.pad_id) == (bpe.vocab_size, 1, 2, None)
  assert copied.encode("text 7 ✓") == load_tokenizer(
      str(source)).encode("text 7 ✓")
  shutil.rmtree(workdir)
  workdirs.export_tokenizer("bytes", str(workdir))
  assert not workdir.exists()
