"""``experiments.lm_eval_model``: lm-eval's ``LM`` over a workdir's model
gives the scorer's log-likelihoods, whole-document scores and the
generator's text (skipped when lm-eval is not installed)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance
from lm_eval.api.model import LM as HarnessLM
from lm_eval.api.registry import get_model

from experiments import evaluate, generate, lm_eval_model, workdirs
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import HFTokenizer, train_bpe
from lin_attn_jax.models import LMConfig
from lin_attn_jax.train import Trainer, TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
MODEL = LMConfig(vocab_size=320, d_model=32, n_layers=1, n_heads=2,
                 mixer="gla")
TEXTS = [f"item {i}: the cat sat on mat {i % 7}. café ✓" for i in range(40)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A random model with a BPE tokenizer, as experiments.train exports
  one."""
  run = tmp_path_factory.mktemp("lm_eval") / "run"
  trainer = Trainer(MODEL, TrainConfig(batch_size=8, seq_len=16, steps=1),
                    mesh=shd.make_mesh("fsdp=1", jax.devices()[:1]))
  workdirs.export_model(str(run), trainer, trainer.init())
  train_bpe(TEXTS, 300).save(str(run))
  return str(run)


def instances(kind, args):
  return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def test_the_adapter_is_lm_evals_lm_and_needs_no_torch(workdir):
  model = get_model("lin_attn_jax").create_from_arg_string(
      f"workdir={workdir},batch_size=4", {"batch_size": None,
                                          "device": "cpu"})
  assert isinstance(model, HarnessLM)
  assert model.batch_size == 4 and isinstance(model.tokenizer, HFTokenizer)
  # In a fresh process: another test may have imported torch here.
  done = subprocess.run(
      [sys.executable, "-c", "import sys, experiments.lm_eval_model; "
       "print(sorted({'torch', 'transformers'} & set(sys.modules)))"],
      capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["[]"]


def test_loglikelihood_is_the_scorers(workdir):
  model = lm_eval_model.LinAttnLM(workdir, batch_size=2)
  pairs = [("the cat sat on", " mat 3"), ("item 4:", " the cat"),
           ("", "café ✓"), ("x", "y")]
  got = model.loglikelihood(instances("loglikelihood", pairs))
  want = evaluate.score_requests(model.lm, model.tokenizer, pairs,
                                 batch_size=3)
  np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want],
                             rtol=1e-5)
  assert [g[1] for g in got] == [w[1] for w in want]
  # A context longer than max_length is cut on the left: the score is
  # that of the last max_length tokens.
  short = lm_eval_model.LinAttnLM(workdir, max_length=4)
  ids, n = evaluate.encode_requests(model.tokenizer, pairs[:1])[0]
  cut = evaluate.score_tokens(model.lm, [(ids[-5:], n)])
  assert short.loglikelihood(instances("loglikelihood", pairs[:1])) == cut


def test_rolling_loglikelihood_scores_every_token_once(workdir, monkeypatch):
  texts = [TEXTS[3], "café"]
  whole = lm_eval_model.LinAttnLM(workdir, max_length=256)
  got = whole.loglikelihood_rolling(instances("loglikelihood_rolling",
                                              [(t,) for t in texts]))
  tokenizer = whole.tokenizer
  forward = nnx.jit(lambda lm, x: lm(x))
  for text, score in zip(texts, got):
    ids = [tokenizer.bos_id] + tokenizer.encode(text)
    logp = jax.nn.log_softmax(forward(whole.lm, jnp.asarray([ids[:-1]]))[0],
                              -1)
    want = sum(float(logp[t, ids[t + 1]]) for t in range(len(ids) - 1))
    assert score == pytest.approx(want, rel=1e-4)
  # Windows of at most 4 inputs: every token is scored once, after the
  # tokens before it (the first after the bos id).
  windows = []
  score_tokens = evaluate.score_tokens

  def recording(lm, encoded, batch_size):
    windows.extend(encoded)
    return score_tokens(lm, encoded, batch_size)

  monkeypatch.setattr(evaluate, "score_tokens", recording)
  windowed = lm_eval_model.LinAttnLM(workdir, max_length=4)
  windowed.loglikelihood_rolling(instances("loglikelihood_rolling",
                                           [(texts[0],)]))
  ids = [tokenizer.bos_id] + tokenizer.encode(texts[0])
  assert len(ids) > 12 and len(windows) > 2
  done = 0
  for window, n in windows:
    # The next n tokens and those right before them, 4 inputs at most.
    assert n >= 1 and len(window) - 1 <= 4
    assert window == ids[done + 1 + n - len(window):done + 1 + n]
    done += n
  assert done == len(ids) - 1


def test_generate_until_is_the_generators(workdir):
  model = lm_eval_model.LinAttnLM(workdir, batch_size=2, max_gen_toks=6)
  contexts = ["item 1: the", "the cat sat", "café"]
  requests = [(contexts[0], {"until": ["."]}),
              (contexts[1], {"until": "."}),
              (contexts[2], {"max_gen_toks": 3, "do_sample": False,
                             "temperature": 0.0})]
  got = model.generate_until(instances("generate_until", requests))
  assert got[:2] == generate.continue_prompts(
      model.lm, model.tokenizer, contexts[:2], max_new_tokens=6,
      stops=["."])
  assert got[2] == generate.continue_prompts(
      model.lm, model.tokenizer, contexts[2:], max_new_tokens=3, stops=[])[0]
  sampled = model.generate_until(instances("generate_until", [
      (contexts[0], {"do_sample": True, "temperature": 1.0, "top_k": 5})]))
  assert isinstance(sampled[0], str)
  with pytest.raises(ValueError, match="unknown gen_kwargs \\['beams'\\]"):
    model.generate_until(instances("generate_until",
                                   [(contexts[0], {"beams": 2})]))
