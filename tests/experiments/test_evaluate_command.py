"""``experiments.evaluate``: perplexity equals the training loop's held-out
loss on the same rows, the multiple-choice scorer picks the answers a
trained model knows, and bad items are named by file and line."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments import evaluate, workdirs
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import (ByteTokenizer, PackedRows, jsonl_corpus,
                               token_bytes, train_bpe)
from lin_attn_jax.models import LM, LMConfig
from lin_attn_jax.train import Trainer, TrainConfig
from lin_attn_jax.train.loop import Evaluator, fit

MODEL = LMConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2,
                 mixer="gla")
SENTENCES = ["the cat sat on the mat. ", "a dog ran in the park. ",
             "two birds sang at dawn. "]


def _documents(n=24):
  return [f"document {i}: " + " ".join(SENTENCES[(i + j) % 3]
                                       for j in range(4)) for i in range(n)]


def _write_jsonl(path, texts):
  with open(path, "w") as f:
    for text in texts:
      f.write(json.dumps({"text": text}) + "\n")


def _trainer(steps=1, lr=3e-3, model=MODEL, mesh="fsdp=-1"):
  config = TrainConfig(batch_size=8, seq_len=32, steps=steps,
                       learning_rate=lr, warmup_steps=0)
  return Trainer(model, config, mesh=shd.make_mesh(mesh), rules="fsdp")


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_perplexity_equals_the_training_loop_heldout_loss(tmp_path, kind):
  """Nats per token and bits per byte of ``evaluate`` are the training
  loop's held-out numbers on the same rows: with byte tokens bits per byte
  is bits per token exactly; with a BPE each target covers its token's
  bytes (the loop on eight devices sums them over the batch's shards)."""
  data = tmp_path / "corpus.jsonl"
  _write_jsonl(data, _documents())
  run = tmp_path / "run"
  if kind == "bytes":
    tokenizer, model, mesh = ByteTokenizer(), MODEL, "fsdp=-1"
  else:
    tokenizer = train_bpe(_documents(), 300)
    tokenizer.save(str(run))
    model = dataclasses.replace(MODEL, vocab_size=320)
    mesh = "data=8"
  trainer = _trainer(model=model, mesh=mesh)
  state = trainer.init()
  workdirs.export_model(str(run), trainer, state)
  config = evaluate.EvaluateConfig(
      workdir=str(run), data=f"jsonl:{data}",
      heldout_fraction=0.5, seq_len=32, batch_size=8, batches=2)
  results = evaluate.evaluate(config)["perplexity"]
  lm = evaluate.load_workdir(config.workdir)
  heldout = evaluate.corpus_of(config, lm,
                               "bytes" if kind == "bytes" else str(run))
  counts = token_bytes(tokenizer, model.vocab_size)
  expected = Evaluator(trainer, PackedRows(heldout, 32, seed=0), 2,
                       counts)(state)
  np.testing.assert_allclose(results["nats_per_token"],
                             expected["eval_loss"], rtol=1e-5)
  assert results["tokens"] == expected["eval_tokens"]
  assert results["bytes"] == expected["eval_bytes"]
  np.testing.assert_allclose(results["bits_per_byte"],
                             expected["eval_bits_per_byte"], rtol=1e-5)
  np.testing.assert_allclose(results["perplexity"],
                             math.exp(expected["eval_loss"]), rtol=1e-5)
  if kind == "bytes":
    # Every target covers one byte.
    assert results["bytes"] == results["tokens"]
    assert expected["eval_bits_per_byte"] == expected["eval_bits_per_token"]
  else:
    # BPE tokens cover several bytes; eos tokens none.
    assert results["bytes"] > 2 * results["tokens"]
    assert expected["eval_bits_per_byte"] < expected["eval_bits_per_token"] / 2
  with pytest.raises(ValueError, match=r"token_bytes must have shape "
                     r"\[vocab_size\]"):
    Evaluator(trainer, PackedRows(heldout, 32, seed=0), 2, counts[:-1])


def test_bpe_token_bytes_add_up_to_the_text():
  texts = _documents() + ["naïve café, 東京 and émigrés ☃"]
  tokenizer = train_bpe(texts, 300)
  counts = token_bytes(tokenizer)
  for text in texts[-3:]:
    ids = tokenizer.encode(text) + [tokenizer.eos_id]
    assert counts[ids].sum() == len(text.encode("utf-8"))
  assert counts[[tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id]
                ].tolist() == [0, 0, 0]
  padded = token_bytes(tokenizer, 320)
  n = tokenizer.vocab_size
  assert padded[:n].tolist() == counts.tolist() and not padded[n:].any()
  assert token_bytes(ByteTokenizer()).tolist() == [1] * 256
  with pytest.raises(ValueError, match="vocab_size = 200 is smaller"):
    token_bytes(ByteTokenizer(), 200)


def test_scores_are_the_sums_of_the_full_forward_logprobs():
  lm = LM(MODEL, rngs=nnx.Rngs(0))
  tokenizer = ByteTokenizer()
  requests = [("the cat ", "sat"), ("a", " dog ran"), ("x y", "z")]
  scores = evaluate.score_requests(lm, tokenizer, requests, batch_size=2)
  forward = nnx.jit(lambda lm, x: lm(x))
  for (context, continuation), (score, greedy) in zip(requests, scores):
    ids = tokenizer.encode(context + continuation)
    logits = forward(lm, jnp.asarray([ids[:-1]]))[0]
    logp = jax.nn.log_softmax(logits, axis=-1)
    # The context's trailing space moves to the continuation (lm-eval).
    n = len(continuation) + len(context) - len(context.rstrip())
    steps = range(len(ids) - 1 - n, len(ids) - 1)
    want = sum(float(logp[t, ids[t + 1]]) for t in steps)
    np.testing.assert_allclose(score, want, rtol=1e-4, atol=1e-4)
    assert greedy == all(int(jnp.argmax(logits[t])) == ids[t + 1]
                         for t in steps)
  # A next token that is the greedy choice, and one that is not.
  ids = tokenizer.encode("the cat s")
  logits = forward(lm, jnp.asarray([ids]))[0, -1]
  best, worst = int(jnp.argmax(logits)), int(jnp.argmin(logits))
  (_, greedy), (_, not_greedy) = evaluate.score_tokens(
      lm, [(ids + [best], 1), (ids + [worst], 1)])
  assert greedy and not not_greedy


@pytest.mark.slow
def test_multiple_choice_picks_the_trained_answers(tmp_path):
  data = tmp_path / "corpus.jsonl"
  _write_jsonl(data, _documents(48))
  trainer = _trainer(steps=150, lr=1e-2)
  corpus = jsonl_corpus(str(data), ByteTokenizer(), split="all")
  result = fit(trainer, PackedRows(corpus, 32, seed=0))
  workdirs.export_model(str(tmp_path / "run"), trainer, result.state)
  items = tmp_path / "items.jsonl"
  with open(items, "w") as f:
    for context, gold, wrong in (("the cat sat on the", " mat", " sky"),
                                 ("a dog ran in the", " park", " moon"),
                                 ("two birds sang at", " dawn", " noon")):
      f.write(json.dumps({"context": context,
                          "continuations": [wrong, gold], "gold": 1}) + "\n")
  out = tmp_path / "results.json"
  config = evaluate.EvaluateConfig(workdir=str(tmp_path / "run"),
                                   choices=str(items), out=str(out))
  results = evaluate.evaluate(config)["multiple_choice"]
  assert results["acc"] == 1.0 and results["acc_norm"] == 1.0
  assert [r["prediction"] for r in results["results"]] == [1, 1, 1]


@pytest.mark.parametrize("line, message", [
    ({"context": "a", "gold": 0}, "no field 'continuations'"),
    ({"context": "a", "continuations": ["b", "c"], "gold": 2},
     "gold 2 is not an index"),
    ({"context": "a", "continuations": [], "gold": 0}, "non-empty list"),
])
def test_bad_items_name_the_file_and_line(tmp_path, line, message):
  path = tmp_path / "items.jsonl"
  good = {"context": "a", "continuations": ["b"], "gold": 0}
  path.write_text(json.dumps(good) + "\n" + json.dumps(line) + "\n")
  with pytest.raises(ValueError, match=re.escape(f"{path}, line 2: ") + f".*{message}"):
    evaluate.read_items(str(path))
