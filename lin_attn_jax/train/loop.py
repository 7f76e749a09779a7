"""The training loop: data, steps, metrics, evaluation, checkpoints, resume.

``fit`` runs a ``Trainer`` over packed rows from step 0, or from the newest
checkpoint in ``workdir`` when there is one, to ``config.steps``:

- batch ``s`` is ``B`` rows of the packed corpus spread over the epoch
  (``data.pipeline``), and each process reads only the rows its devices
  hold;
- every step's metrics (loss, gradient norm, learning rate, tokens/s, MFU
  where the devices have a known peak) go to the callbacks and, from
  process 0, to ``<workdir>/metrics.jsonl`` (lines of steps that a resumed
  run repeats are replaced);
- held-out loss (nats and bits per token, and bits per byte given the
  bytes each token id stands for) is measured every ``eval_every`` steps
  and at the end on fixed held-out batches;
- checkpoints every ``checkpoint_every`` steps and at the end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from lin_attn_jax.data.packing import PackedRows
from lin_attn_jax.data.pipeline import (BatchSource, global_batch_to_device,
                                        process_rows)
from lin_attn_jax.train import flops
from lin_attn_jax.train.checkpoint import Checkpointer
from lin_attn_jax.train.trainer import Trainer, TrainState

METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"


@dataclasses.dataclass
class FitResult:
  """What ``fit`` returns."""

  # The final train state (sharded on the trainer's mesh).
  state: TrainState
  # The step the run started from (0, or the restored checkpoint's).
  start_step: int
  # Metrics of every step this call ran, then of every evaluation.
  history: list[dict]
  # The last held-out evaluation, if any.
  last_eval: dict | None


def data_record(trainer: Trainer, rows: PackedRows, step: int) -> dict:
  return {"step": step, "seed": rows.seed, "row_len": rows.row_len,
          "batch_size": trainer.config.batch_size,
          "corpus": rows.corpus.name,
          "corpus_fingerprint": rows.corpus.fingerprint()}


def _check_data_record(stored: dict, expected: dict, log) -> None:
  differ = [k for k in ("seed", "row_len", "batch_size", "corpus_fingerprint")
            if stored.get(k) != expected.get(k)]
  if differ:
    log("resuming with other data settings than the checkpoint's ("
        + ", ".join(f"{k}: {stored.get(k)!r} -> {expected.get(k)!r}"
                    for k in differ)
        + "): the batches after the resume differ from the original run's")


class Evaluator:
  """Held-out loss on ``num_batches`` fixed batches of ``rows``.

  Returns nats and bits per token, and the accuracy (the share of counted
  targets that are the logits' argmax: of the labels, for a classifier);
  with ``token_bytes`` (``[vocab_size]``,
  the UTF-8 bytes of text each id stands for, ``data.token_bytes``) also
  bits per byte: the summed loss over the bytes the counted targets cover,
  comparable across tokenizers (with byte tokens, every count 1, it is bits
  per token exactly).
  """

  def __init__(self, trainer: Trainer, rows: PackedRows, num_batches: int,
               token_bytes: np.ndarray | None = None):
    self.trainer, self.num_batches = trainer, num_batches
    self.positions = process_rows(trainer.mesh, trainer.config.batch_size)
    self.source = BatchSource(rows, trainer.config.batch_size,
                              self.positions)
    if token_bytes is not None:
      token_bytes = np.asarray(token_bytes)
      vocab = trainer.model_config.vocab_size
      if token_bytes.shape != (vocab,):
        raise ValueError(f"token_bytes must have shape [vocab_size] = "
                         f"({vocab},), got {token_bytes.shape}")
    self.token_bytes = token_bytes
    self._batches = None
    self._bytes = 0

  def batches(self):
    if self._batches is None:
      local = [self.source.batch(i) for i in range(self.num_batches)]
      self._batches = [global_batch_to_device(
          batch, self.positions, self.trainer.mesh,
          self.trainer.config.batch_size) for batch in local]
      if self.token_bytes is not None:
        self._bytes = sum(self._covered(batch) for batch in local)
    return self._batches

  def _covered(self, local: dict) -> int:
    """The bytes the counted targets of a batch cover, over the rows of
    every process (this process holds ``local``)."""
    counts = np.where(local["weights"] > 0,
                      self.token_bytes[local["targets"]], 0)     # [b, T]
    placed = global_batch_to_device(
        {"bytes": counts.astype(np.int32)}, self.positions,
        self.trainer.mesh, self.trainer.config.batch_size)["bytes"]
    return int(_total(placed))

  def __call__(self, state: TrainState) -> dict:
    loss_sum = tokens = correct = 0.0
    for batch in self.batches():
      sums = self.trainer.eval_sums(state, batch)
      loss_sum += float(sums["loss_sum"])
      tokens += float(sums["tokens"])
      correct += float(sums["correct"])
    loss = loss_sum / max(tokens, 1.0)
    out = {"eval_loss": loss, "eval_bits_per_token": loss / math.log(2),
           "eval_tokens": tokens,
           "eval_accuracy": correct / max(tokens, 1.0)}
    if self.token_bytes is not None:
      out["eval_bits_per_byte"] = (loss_sum / self._bytes / math.log(2)
                                   if self._bytes else float("nan"))
      out["eval_bytes"] = self._bytes
    return out


@jax.jit
def _total(x):
  return jnp.sum(x)


class MetricsLog:
  """``metrics.jsonl`` in the work directory, written by process 0."""

  def __init__(self, workdir: str | None):
    self.path = (None if workdir is None or jax.process_index() != 0
                 else os.path.join(workdir, METRICS_FILE))

  def truncate_after(self, step: int, evals_at_step: bool = True) -> None:
    """Drops the lines of steps after ``step`` (a resumed run redoes them),
    and the evaluations at ``step`` unless ``evals_at_step``."""
    if self.path is None or not os.path.exists(self.path):
      return
    with open(self.path) as f:
      lines = [line for line in f if line.strip()]

    def kept_line(record):
      at = record.get("step", 0)
      return at < step or at == step and (evals_at_step
                                           or "eval_loss" not in record)

    kept = [line for line in lines if kept_line(json.loads(line))]
    with open(self.path, "w") as f:
      f.writelines(kept)

  def write(self, record: dict) -> None:
    if self.path is None:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")


def fit(trainer: Trainer, train_rows: PackedRows, *,
        workdir: str | None = None,
        heldout_rows: PackedRows | None = None, eval_every: int = 0,
        eval_batches: int = 4,
        callbacks: Sequence[Callable[[dict, TrainState], Any]] = (),
        log: Callable[[str], Any] | None = None,
        init_params: Any = None,
        init_rest: Any = None,
        checkpoint_dir: str | None = None,
        eval_at_start: bool = False,
        token_bytes: np.ndarray | None = None) -> FitResult:
  """Trains to ``trainer.config.steps``; see the module docstring.

  Args:
    trainer: the model, optimizer and mesh.
    train_rows: packed training rows (their ``row_len`` must be the
      config's ``seq_len``).
    workdir: checkpoints and metrics go here; a run resumes from it.
    heldout_rows: rows for the held-out evaluation (None: no evaluation).
    eval_every: evaluate every this many steps (0: only at the end).
    eval_batches: held-out batches per evaluation.
    callbacks: called as ``f(record, state)`` after every step (``record``
      holds ``step`` and the metrics) and every evaluation (``record`` has
      ``eval_loss``).
    log: where progress lines go (default ``absl.logging.info``).
    init_params: an ``nnx.State`` of parameters to start from instead of
      the config's initialisation (ignored when resuming).
    init_rest: with ``init_params``, the non-parameter state to start from
      (``Trainer.init()``'s ``rest`` with stored variables such as the
      routers' selection biases put in; ignored when resuming).
    checkpoint_dir: where checkpoints go instead of
      ``<workdir>/checkpoints`` (a local path or a ``gs://`` URL).
    eval_at_start: also evaluate the starting model of a new run (step 0),
      so that the held-out curve starts where training does.
    token_bytes: ``[vocab_size]``, the UTF-8 bytes of text each token id
      stands for (``data.token_bytes``); the evaluations then report
      ``eval_bits_per_byte`` and ``eval_bytes`` too (see ``Evaluator``).
  """
  log = log or logging.info
  config = trainer.config
  if train_rows.row_len != config.seq_len:
    raise ValueError(f"rows hold {train_rows.row_len} tokens, seq_len is "
                     f"{config.seq_len}")
  checkpointer = None
  state, start = None, 0
  metrics_log = MetricsLog(workdir)
  if workdir is not None or checkpoint_dir is not None:
    checkpointer = Checkpointer(
        checkpoint_dir or os.path.join(workdir, CHECKPOINT_DIR),
        keep=config.checkpoint_keep,
        every=config.checkpoint_every,
        async_save=config.async_checkpoints, log=log)
    restored = trainer.restore(checkpointer)
    if restored is not None:
      state, stored_data, start = restored
      _check_data_record(stored_data, data_record(trainer, train_rows, start),
                         log)
      log(f"resuming from the checkpoint at step {start} in "
          f"{checkpointer.directory}")
      # A finished run is evaluated again at its last step.
      metrics_log.truncate_after(start, evals_at_step=start < config.steps)
  if state is None:
    state = trainer.init()
    if init_params is not None:
      state = state.replace(params=_placed(init_params,
                                           trainer.state_shardings.params))
    if init_rest is not None:
      state = state.replace(rest=_placed(init_rest,
                                         trainer.state_shardings.rest))
    metrics_log.truncate_after(0)
  evaluator = (None if heldout_rows is None else
               Evaluator(trainer, heldout_rows, eval_batches, token_bytes))
  abstract = nnx.eval_shape(lambda: trainer.model_class(trainer.model_config,
                                                        rngs=nnx.Rngs(0)))
  flops_token = flops.flops_per_token(abstract, config.seq_len)
  positions = process_rows(trainer.mesh, config.batch_size)
  source = BatchSource(train_rows, config.batch_size, positions)
  history: list[dict] = []
  last_eval = None

  def evaluate(step):
    nonlocal last_eval
    last_eval = {"step": step, **evaluator(state)}
    history.append(last_eval)
    metrics_log.write(last_eval)
    for callback in callbacks:
      callback(last_eval, state)

  try:
    if evaluator is not None and eval_at_start and start == 0:
      evaluate(0)
    batches = source.iterator(start, config.steps)
    for step in range(start, config.steps):
      batch = global_batch_to_device(next(batches), positions, trainer.mesh,
                                     config.batch_size)
      began = time.perf_counter()
      state, metrics = trainer.step(state, batch)
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      seconds = time.perf_counter() - began
      tokens_per_second = config.tokens_per_step / seconds
      record = {"step": step + 1, **metrics, "seconds": seconds,
                "tokens_per_second": tokens_per_second,
                "mfu": flops.mfu(tokens_per_second, flops_token,
                                 trainer.mesh.devices.flat)}
      history.append(record)
      metrics_log.write(record)
      for callback in callbacks:
        callback(record, state)
      if checkpointer is not None:
        checkpointer.maybe_save(step + 1, state,
                                data_record(trainer, train_rows, step + 1),
                                trainer.config_record())
      if evaluator is not None and eval_every and (step + 1) % eval_every == 0:
        evaluate(step + 1)
    end = max(start, config.steps)
    if evaluator is not None and not (history and history[-1].get(
        "eval_loss") is not None and history[-1]["step"] == end):
      evaluate(end)
    if checkpointer is not None:
      checkpointer.save(end, state, data_record(trainer, train_rows, end),
                        trainer.config_record())
  finally:
    if checkpointer is not None:
      checkpointer.close()
  return FitResult(state, start, history, last_eval)


def _placed(params, shardings):
  return jax.tree.map(lambda x, s: jax.device_put(np.asarray(x), s)
                      if not isinstance(x, jax.Array) or x.sharding != s
                      else x, params, shardings)
