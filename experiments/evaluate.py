"""Evaluates a checkpoint: perplexity and bits per byte on a corpus, and
log-likelihood scoring of multiple-choice items.

  python -m experiments.evaluate --config.workdir=runs/tiny \\
      --config.data='jsonl:heldout/*.jsonl' --config.split=all
  python -m experiments.evaluate --config.workdir=CONVERTED \\
      --config.choices=items.jsonl --config.out=results.json

The model is a workdir's ``config.json`` and ``params/`` (written by
``experiments.train`` or ``experiments.convert``), its tokenizer the
workdir's tokenizer files when it has them (``--config.tokenizer`` names
another, or ``bytes``), else bytes.

Perplexity: the corpus of ``data`` (a data spec, as ``experiments.train``
reads it, ``experiments/configs/base.py``) is split as training splits it,
and the documents of ``split`` are packed into rows of ``seq_len + 1``
tokens with segment ids (``PackedRows``, seed 0), exactly the held-out rows
of the training loop. ``batches=N`` scores the first ``N`` batches of
``batch_size`` rows, the rows ``fit``'s held-out evaluation reads with
``eval_batches=N`` (so the loss is the training loop's held-out loss);
``batches=0`` scores every row of one epoch. With ``L`` the summed
``-log p`` (nats) over the counted targets (the next token of the same
document), ``n`` their count and ``b`` the UTF-8 bytes of text they cover:
``nats_per_token = L / n``, ``perplexity = exp(L / n)``,
``bits_per_byte = L / (b ln 2)``; a token covers the bytes of its own text
(``lin_attn_jax.data.token_bytes``: 1 for byte tokens, 0 for special
tokens such as eos), so bits per byte is comparable across tokenizers; the
training loop reports the same number as its held-out bits per byte.

Multiple choice (``choices``): a jsonl file, one item a line,
``{"context": str, "continuations": [str, ...], "gold": int}``: the
``loglikelihood`` requests of lm-evaluation-harness, ``(context,
continuation)`` for every continuation, encoded as its ``TemplateLM``
does (trailing spaces of the context move to the continuation; the
continuation's tokens are those of ``context + continuation`` after the
context's; an empty context is the bos, else eos, id). The score of a
continuation is the sum of its tokens' log-probabilities given what comes
before; ``acc`` counts items whose best score is gold's, ``acc_norm`` those
whose best score divided by the continuation's length in characters is
gold's (lm-eval's ``acc`` and ``acc_norm``).

lm-evaluation-harness: its ``lm_eval.api.model.LM`` base class imports no
torch (abc, tqdm and ``lm_eval.utils``), so ``experiments.lm_eval_model``
(the ``lm_eval`` extra) wraps a workdir's model in it with the scorer here
(``score_requests``) and ``experiments.generate``'s ``continue_prompts``.
This command needs no lm-eval: it reads items saved locally in the shape
above.

The results print as a markdown table and go to ``out`` as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import config_flags
from experiments import train_setup
from experiments.configs.base import Experiment, parse_data
from experiments.generate import load_workdir
from lin_attn_jax.data import PackedRows, tokenizers
from lin_attn_jax.data.pipeline import BatchSource
from lin_attn_jax.ops.common import checks
from lin_attn_jax.train import TrainConfig
from lin_attn_jax.train.loss import cross_entropy_sums

SPLITS = ("heldout", "train")


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
  """What to evaluate, on what, and where the results go."""

  # Directory with config.json and params/ (experiments.train or
  # experiments.convert).
  workdir: str = ""
  # Tokenizer: "" (the workdir's tokenizer files, else bytes), "bytes", a
  # tokenizer.json, a SentencePiece .model or a directory holding one.
  tokenizer: str = ""
  # Corpus for perplexity, a data spec (experiments/configs/base.py);
  # "" skips perplexity.
  data: str = ""
  # Which documents of data: "heldout" or "train" (as training splits).
  split: str = "heldout"
  # Fraction of the documents in the held-out split, in (0, 1) (each split
  # must hold a document, as in training).
  heldout_fraction: float = 0.02
  # Tokens a row predicts (the rows hold seq_len + 1).
  seq_len: int = 256
  # Rows per forward pass.
  batch_size: int = 8
  # Batches scored: the first N (fit's held-out rows with eval_batches=N),
  # or 0 for every row of one epoch.
  batches: int = 0
  # Multiple-choice items, a jsonl file; "" skips them.
  choices: str = ""
  # Each item's reported prediction: the best score divided by the
  # continuation's length in characters (true) or the best score (false);
  # acc and acc_norm are both reported either way.
  length_normalized: bool = False
  # Where the JSON results go; "" prints only the table.
  out: str = ""

  def __post_init__(self):
    if self.split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
    if self.data:
      parse_data(self.data)
    if not 0 < self.heldout_fraction < 1:
      raise ValueError("heldout_fraction must be in (0, 1), got "
                       f"{self.heldout_fraction!r}")
    checks.positive_int("seq_len", self.seq_len)
    checks.positive_int("batch_size", self.batch_size)
    if self.batches != 0:
      checks.positive_int("batches", self.batches, also=" or 0")

  def to_dict(self) -> dict:
    return config_flags.to_dict(self)

  @classmethod
  def from_dict(cls, values) -> "EvaluateConfig":
    return config_flags.from_dict(cls, values)


PRESETS = {"default": EvaluateConfig()}


@nnx.jit
def _loss_sums(lm, inputs, targets, weights, segment_ids):
  logits = lm(inputs, segment_ids=segment_ids)
  loss_sum, count, _ = cross_entropy_sums(logits, targets, weights)
  return loss_sum, count


def corpus_of(config: EvaluateConfig, lm, tokenizer_name: str):
  """The documents of ``config.split`` of ``config.data``, read as
  ``experiments.train`` reads them (``train_setup.load_corpora``)."""
  experiment = Experiment(
      model=lm.config,
      train=TrainConfig(batch_size=config.batch_size,
                        seq_len=config.seq_len),
      data=config.data, tokenizer=tokenizer_name,
      heldout_fraction=config.heldout_fraction)
  train, heldout = train_setup.load_corpora(experiment)
  return heldout if config.split == "heldout" else train


def perplexity(lm, rows: PackedRows, batch_size: int, batches: int,
               byte_counts: np.ndarray) -> dict:
  """Nats per token, perplexity and bits per byte of ``rows`` (see the
  module docstring): batch ``s`` is ``BatchSource.batch(s)``, the rows the
  training loop reads at step ``s``."""
  source = BatchSource(rows, batch_size, np.arange(batch_size))
  steps = batches or max(rows.rows_per_epoch // batch_size, 1)
  loss_sum = tokens = covered = 0.0
  for step in range(steps):
    batch = source.batch(step)
    sums = _loss_sums(lm, *(jnp.asarray(batch[k]) for k in
                            ("inputs", "targets", "weights", "segment_ids")))
    loss_sum += float(sums[0])
    tokens += float(sums[1])
    covered += float(np.sum(byte_counts[batch["targets"]]
                            * batch["weights"]))
  if not tokens:
    raise ValueError("no target was scored; use a longer seq_len or more "
                     "data")
  return {"nats_per_token": loss_sum / tokens,
          "perplexity": math.exp(loss_sum / tokens),
          "bits_per_token": loss_sum / tokens / math.log(2),
          "bits_per_byte": (loss_sum / covered / math.log(2) if covered
                            else float("nan")),
          "tokens": int(tokens), "bytes": int(covered), "rows":
          steps * batch_size}


def read_items(path: str) -> list[dict]:
  """The multiple-choice items of a jsonl file; raises ``ValueError``
  naming the file and line of a bad one."""
  items = []
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      where = f"{path}, line {number}"
      if not line.strip():
        continue
      try:
        item = json.loads(line.decode("utf-8"))
      except UnicodeDecodeError as error:
        raise ValueError(f"{where}: not UTF-8 ({error.reason} at byte "
                         f"{error.start})") from None
      except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not JSON ({error.msg})") from None
      if not isinstance(item, dict):
        raise ValueError(f"{where}: not a JSON object")
      missing = [k for k in ("context", "continuations", "gold")
                 if k not in item]
      if missing:
        raise ValueError(f"{where}: no field {', '.join(map(repr, missing))}"
                         f" (an item is {{\"context\": str, "
                         f"\"continuations\": [str, ...], \"gold\": int}})")
      context, options, gold = (item["context"], item["continuations"],
                                item["gold"])
      if not isinstance(context, str):
        raise ValueError(f"{where}: context is not a string")
      if (not isinstance(options, list) or not options
          or not all(isinstance(o, str) and o for o in options)):
        raise ValueError(f"{where}: continuations must be a non-empty list "
                         "of non-empty strings")
      if (not isinstance(gold, int) or isinstance(gold, bool)
          or not 0 <= gold < len(options)):
        raise ValueError(f"{where}: gold {gold!r} is not an index of the "
                         f"{len(options)} continuations")
      items.append({"context": context, "continuations": options,
                    "gold": gold, "where": where})
  if not items:
    raise ValueError(f"{path} holds no items")
  return items


def encode_pair(tokenizer, context: str, continuation: str):
  """``(context ids, continuation ids)`` as lm-eval's ``TemplateLM``
  encodes a loglikelihood request (see the module docstring)."""
  if not context:
    prefix = (tokenizer.bos_id if tokenizer.bos_id is not None
              else tokenizer.eos_id)
    if prefix is None:
      raise ValueError("an empty context needs a bos or eos id; the "
                       f"tokenizer has neither ({tokenizer!r})")
    return [prefix], tokenizer.encode(continuation)
  spaces = len(context) - len(context.rstrip())
  if spaces:
    context, continuation = context[:-spaces], context[-spaces:] + continuation
  whole = tokenizer.encode(context + continuation)
  context_ids = tokenizer.encode(context)
  return context_ids, whole[len(context_ids):]


@nnx.jit
def _token_logprobs(lm, inputs, targets):
  logits = lm(inputs).astype(jnp.float32)                      # [B, T, V]
  logp = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  greedy = jnp.argmax(logits, axis=-1) == targets              # [B, T]
  return picked, greedy


def _bucket(length: int) -> int:
  """Lengths rounded up to a power of two (at least 16), so that few
  shapes compile."""
  return max(16, 1 << (length - 1).bit_length())


def encode_requests(tokenizer, requests) -> list[tuple[list[int], int]]:
  """``(ids, n)`` of each ``(context, continuation)`` request: the ids of
  both (``encode_pair``) and the continuation's count."""
  encoded = []
  for context, continuation in requests:
    context_ids, continuation_ids = encode_pair(tokenizer, context,
                                                continuation)
    if not continuation_ids:
      raise ValueError(f"continuation {continuation!r} of {context!r} "
                       "encodes to no tokens")
    encoded.append((context_ids + continuation_ids, len(continuation_ids)))
  return encoded


def score_tokens(lm, encoded, batch_size: int = 8
                 ) -> list[tuple[float, bool]]:
  """For each ``(ids, n)`` (``len(ids) > n >= 1``): the summed
  log-probability of the last ``n`` ids given the ones before them, and
  whether every one of them is the model's most likely next token
  (lm-eval's ``(logprob, is_greedy)``). Rows are right-padded to a
  power-of-two width: a causal model's scores of a row's tokens do not
  depend on what follows them."""
  scores = []
  for start in range(0, len(encoded), batch_size):
    chunk = encoded[start:start + batch_size]
    width = _bucket(max(len(ids) for ids, _ in chunk) - 1)
    inputs = np.zeros((batch_size, width), np.int32)
    targets = np.zeros((batch_size, width), np.int32)
    for row, (ids, n) in enumerate(chunk):
      if not 1 <= n < len(ids):
        raise ValueError(f"a request scores n = {n} of its {len(ids)} ids; "
                         "it needs 1 <= n < len(ids)")
      inputs[row, :len(ids) - 1] = ids[:-1]
      targets[row, :len(ids) - 1] = ids[1:]
    logp, greedy = _token_logprobs(lm, jnp.asarray(inputs),
                                   jnp.asarray(targets))
    logp, greedy = np.asarray(logp), np.asarray(greedy)
    for row, (ids, n) in enumerate(chunk):
      end = len(ids) - 1
      scores.append((float(np.sum(logp[row, end - n:end], dtype=np.float64)),
                     bool(np.all(greedy[row, end - n:end]))))
  return scores


def score_requests(lm, tokenizer, requests, batch_size: int = 8
                   ) -> list[tuple[float, bool]]:
  """lm-eval's ``loglikelihood``: for each ``(context, continuation)``, the
  summed log-probability of the continuation given the context and whether
  it is the greedy continuation (``encode_requests``, ``score_tokens``)."""
  return score_tokens(lm, encode_requests(tokenizer, requests), batch_size)


def multiple_choice(lm, tokenizer, items: list[dict], batch_size: int = 8,
                    length_normalized: bool = False) -> dict:
  """``acc`` and ``acc_norm`` of ``items`` (``read_items``), with each
  item's scores and prediction (by the normalised score with
  ``length_normalized``)."""
  requests = [(item["context"], option) for item in items
              for option in item["continuations"]]
  flat = [score for score, _ in score_requests(lm, tokenizer, requests,
                                                batch_size)]
  acc = acc_norm = 0
  results = []
  for item in items:
    n = len(item["continuations"])
    scores, flat = flat[:n], flat[n:]
    normed = [s / len(o) for s, o in zip(scores, item["continuations"])]
    best, best_norm = int(np.argmax(scores)), int(np.argmax(normed))
    acc += best == item["gold"]
    acc_norm += best_norm == item["gold"]
    results.append({"where": item["where"], "gold": item["gold"],
                    "prediction": best_norm if length_normalized else best,
                    "scores": scores})
  return {"acc": acc / len(items), "acc_norm": acc_norm / len(items),
          "items": len(items), "results": results}


def evaluate(config: EvaluateConfig) -> dict:
  """The results of ``config`` (see the module docstring)."""
  if not config.workdir:
    raise config_flags.FlagError(f"{config_flags.PREFIX}.workdir",
                                 "is required")
  if not (config.data or config.choices):
    raise config_flags.FlagError(
        config_flags.PREFIX, "give --config.data (perplexity) or "
        "--config.choices (multiple choice), or both")
  lm = load_workdir(config.workdir)
  tokenizer_name = config.tokenizer or None
  if tokenizer_name is None and tokenizers.tokenizer_files(config.workdir):
    tokenizer_name = config.workdir
  tokenizer = tokenizers.load_tokenizer(tokenizer_name)
  tokenizers.check_vocab(tokenizer, lm.config.vocab_size)
  results = {"workdir": config.workdir, "tokenizer": repr(tokenizer)}
  if config.data:
    corpus = corpus_of(config, lm, tokenizer_name or "bytes")
    rows = PackedRows(corpus, config.seq_len, seed=0)
    counts = tokenizers.token_bytes(tokenizer, lm.config.vocab_size)
    results["perplexity"] = {"data": config.data, "split": config.split,
                             **perplexity(lm, rows, config.batch_size,
                                          config.batches, counts)}
  if config.choices:
    results["multiple_choice"] = {
        "file": config.choices,
        **multiple_choice(lm, tokenizer, read_items(config.choices),
                          config.batch_size, config.length_normalized)}
  return results


def table(results: dict) -> str:
  """The results as a markdown table."""
  lines = ["| metric | value |", "|---|---|"]
  for key in ("perplexity", "multiple_choice"):
    for name, value in results.get(key, {}).items():
      if name == "results":
        continue
      shown = f"{value:.4f}" if isinstance(value, float) else str(value)
      lines.append(f"| {key}.{name} | {shown} |")
  return "\n".join(lines)


FLAGS = flags.FLAGS
OVERRIDES: dict = {}


def main(argv):
  if not FLAGS["verbosity"].present:
    # Orbax logs every restore at INFO.
    logging.set_verbosity(logging.WARNING)
  config = config_flags.command_config(argv, PRESETS, "default", OVERRIDES)
  try:
    results = evaluate(config)
  except (ValueError, OSError, ImportError) as error:
    config_flags.fail(str(error))
  print(f"{config.workdir} ({results['tokenizer']})")
  print(table(results))
  if config.out:
    os.makedirs(os.path.dirname(os.path.abspath(config.out)), exist_ok=True)
    with open(config.out, "w") as f:
      json.dump(results, f, indent=1)
    print(f"results: {config.out}")


if __name__ == "__main__":
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES))
