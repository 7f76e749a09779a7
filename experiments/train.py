"""Trains a language model, a sequence classifier or a masked LM: mesh,
data, model, progress, evaluation, samples, checkpoints, plots.

  python -m experiments.train --workdir=runs/tiny                # CPU
  python -m experiments.train --workdir=runs/tiny \\
      --config.train.steps=1200                                    # extend
  python -m experiments.train --config=small --workdir=runs/small \\
      --config.model.mixer=gla,gla,gla,sliding_window_attn \\
      --config.model.n_layers=12 --config.model.mixer_options.gla.chunk_size=32
  python -m experiments.train --workdir=runs/ft --init_from=CONVERTED_DIR
  python -m experiments.train --task=classify --workdir=runs/listops \
      --config.data=listops --config.train.seq_len=512 \
      --config.model.num_classes=10 --config.model.max_len=512
  python -m experiments.train --task=mlm --workdir=runs/mlm
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
      python -m experiments.train --workdir=runs/x \\
      --config.mesh=data=2,fsdp=4

``--task`` (``--config.task``) says what is trained (``Experiment.task``):
``lm`` (the default: next-token loss over packed text, with samples),
``classify`` (a ``Classifier`` over the labelled examples of a
``listops``, ``pathfinder`` or ``synthetic`` data spec, one per row,
held-out loss and accuracy on the validation split) or ``mlm`` (a
``MaskedLM`` over the packed text, BERT's masking). The model fields of the
task's config (``model.num_classes``, ``model.pooling``, ...) are
``--config.model.<field>`` flags too. Only ``lm`` samples.

``--config=NAME`` picks a preset (the modules of ``experiments/configs/``,
each an ``Experiment``); ``--config.<field>=VALUE`` changes any field of it
by its dotted name (``experiments/config_flags.py``), and a bad value stops
the run before anything is compiled, with one line naming the field. The
other flags say where the run reads and writes and how it shows progress.

A work directory that holds a checkpoint resumes from it (and says so)
with the run's own settings (``experiment.json``): overrides given again
change the training settings (``--config.train.steps`` extends the run);
overrides of the model must agree with the checkpoint, except its dtype
and remat. ``--init_from`` starts a new run from the parameters of a
converted model (``python -m experiments.convert``: ``config.json`` +
``params/``) or of another training run (its newest checkpoint); the model
is then theirs.

On a terminal a progress bar shows the loss, tokens/s and the ETA (plain
lines otherwise). Held-out bits per byte (the loss over the UTF-8 bytes of
text the held-out tokens stand for, comparable across tokenizers; bits per
token for token files of unknown text) are
measured at the start, every ``config.eval_every`` steps and at the end; a
greedy sample is printed every ``config.sample_every`` steps and, at the
end, from the parameters read back from the saved checkpoint. The work
directory gets ``metrics.jsonl``, ``loss.png`` (matplotlib),
``tensorboard/`` (tensorboardX), the checkpoints, and the final model as
``config.json`` + ``params/`` with the tokenizer's files.

Several processes (TPU pod slices, GPU clusters, local CPU processes) run
the same command: ``--coordinator_address``, ``--num_processes`` and
``--process_id`` (or the ``JAX_*`` variables, or a cluster JAX detects).
"""

from __future__ import annotations

import dataclasses
import os
import time

from absl import app, flags, logging
import jax
import numpy as np

from experiments import config_flags, configs, run_output, workdirs
from experiments import train_setup as setup
from experiments.configs.base import Experiment
from lin_attn_jax import sharding as shd
from lin_attn_jax.data.corpus import BYTE_VOCAB
from lin_attn_jax.train import Trainer, distributed
from lin_attn_jax.train.loop import METRICS_FILE, fit

FLAGS = flags.FLAGS
flags.DEFINE_string("config", "tiny", "Preset: " + ", ".join(configs.PRESETS)
                    + " (experiments/configs/); --config.<field>=VALUE "
                    "overrides a field by dotted name, e.g. "
                    "--config.model.d_model=256, --config.train.steps=50.")
flags.DEFINE_enum("task", None, ["lm", "classify", "mlm"], "What is "
                  "trained (--config.task): lm, classify or mlm; a resumed "
                  "run keeps its own.")
flags.DEFINE_bool("show_config", False, "Print the config (the preset with "
                  "the overrides) as --config.<field>=VALUE lines and exit.")
flags.DEFINE_string("workdir", None, "Checkpoints, metrics, plot and the "
                    "final model go here; a run resumes from its newest "
                    "checkpoint.")
flags.DEFINE_string("checkpoint_dir", None, "Checkpoints here instead of "
                    "WORKDIR/checkpoints (a shared path or gs://bucket/path "
                    "for multi-host runs).")
flags.DEFINE_string("init_from", None, "Start a new run from these "
                    "parameters: a directory of experiments.convert "
                    "(config.json + params/) or a training workdir.")
flags.DEFINE_string("export_dir", None, "Where the final model (config.json "
                    "+ params/) goes (default WORKDIR in a one-process run; "
                    "a multi-process run exports only when given a shared "
                    "path).")
flags.DEFINE_enum("progress", "auto", ["auto", "bar", "lines"], "Progress "
                  "bar (auto: on a terminal) or plain lines.")
flags.DEFINE_string("compilation_cache", None, "Directory of JAX's "
                    "persistent compilation cache (a second run with the "
                    "same shapes skips compiling).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 "
                    "in a multi-process run.")
flags.DEFINE_integer("num_processes", None, "Processes of the run.")
flags.DEFINE_integer("process_id", None, "This process's index.")
flags.DEFINE_bool("multihost", False, "Let JAX find the other processes "
                  "(jax.distributed.initialize() without arguments): Cloud "
                  "TPU VM slices, whose hosts the environment does not "
                  "name, SLURM, Open MPI.")

PLOT_FILE = "loss.png"
EVENTS_DIR = "tensorboard"
# The --config.<field>=VALUE arguments of the command line, by field path.
OVERRIDES: dict[str, str | None] = {}


@dataclasses.dataclass
class Run:
  """A resolved run: its settings and what they built."""

  # The settings, the preset's with the overrides applied.
  experiment: Experiment
  # Name of the preset the run was started from.
  preset: str
  # The mesh, the model and the compiled steps.
  trainer: Trainer
  # (training, held-out) corpora.
  corpora: tuple
  # Where the checkpoints are.
  checkpoint_dir: str
  # Step of the newest checkpoint (None: a new run).
  resume_step: int | None
  # [vocab_size] UTF-8 bytes of text each token id stands for (held-out
  # bits per byte), or None when they are not known.
  token_bytes: np.ndarray | None = None

  @property
  def unit(self) -> str:
    """What the loss curves (per token) are measured in."""
    if self.experiment.task == "classify":
      return "bits/example"
    return ("bits/byte" if self.experiment.model.vocab_size == BYTE_VOCAB
            else "bits/token")


def held_out(record: dict, task: str = "lm") -> tuple[float, str]:
  """``(value, unit)`` of an evaluation record: the accuracy of a
  classifier, else bits per byte when the bytes are known, else bits per
  token."""
  if task == "classify":
    return 100 * record["eval_accuracy"], "% accuracy"
  if "eval_bits_per_byte" in record:
    return record["eval_bits_per_byte"], "bits/byte"
  return record["eval_bits_per_token"], "bits/token"


def task_overrides() -> dict[str, str | None]:
  """The ``--config.*`` overrides with ``--task`` as ``task``."""
  if FLAGS.task is None:
    return OVERRIDES
  given = OVERRIDES.get("task", FLAGS.task)
  if given != FLAGS.task:
    raise setup.FlagError("task", f"--config.task={given} says otherwise; "
                          "give one of them")
  return {"task": FLAGS.task, **OVERRIDES}


def prepare() -> Run:
  """Flags and overrides -> the run; raises ``FlagError``."""
  if not FLAGS.workdir:
    raise setup.FlagError("workdir", "is required: the directory of the "
                          "run's checkpoints, metrics and plot (e.g. "
                          "runs/tiny)")
  try:
    base = configs.get(FLAGS.config)
  except ValueError as error:
    raise setup.FlagError("config", str(error)) from None
  workdir = FLAGS.workdir
  checkpoint_dir = workdirs.checkpoint_dir(workdir, FLAGS.checkpoint_dir)
  resume_step = workdirs.latest_checkpoint(checkpoint_dir)
  preset, fixed_model, fixed_by = FLAGS.config, None, ""
  stored = workdirs.read_json(workdirs.join(workdir,
                                            workdirs.EXPERIMENT_FILE))
  if resume_step is not None:
    if stored is not None:
      if FLAGS["config"].present and stored["preset"] != FLAGS.config:
        raise setup.FlagError(
            "config", f"the run in {workdir} was started from preset "
            f"{stored['preset']!r} and resumes with its own settings; drop "
            "--config or use another --workdir")
      base, preset = Experiment.from_dict(stored["settings"]), stored["preset"]
      fixed_model = base.model
      task = task_overrides().get("task")
      if task is not None and task != base.task:
        raise setup.FlagError(
            "task", f"the run in {workdir} trains task {base.task!r} and "
            "resumes with it; drop --task or use another --workdir")
    else:
      fixed_model = workdirs.stored_model_config(checkpoint_dir, resume_step)
    fixed_by = f"the checkpoint in {checkpoint_dir}"
  elif FLAGS.init_from:
    if task_overrides().get("task", base.task) != "lm":
      raise setup.FlagError("init_from", "starts language models (task lm) "
                            "only")
    try:
      fixed_model = workdirs.source_model_config(FLAGS.init_from)
    except (ValueError, OSError) as error:
      raise setup.FlagError("init_from", str(error)) from None
    fixed_by = f"--init_from={FLAGS.init_from}"
  experiment = setup.resolve(base, task_overrides(), fixed_model, fixed_by)
  return Run(experiment, preset, setup.build_trainer(experiment),
             setup.load_corpora(experiment), checkpoint_dir, resume_step,
             setup.token_bytes(experiment))


def announce(run: Run, say) -> None:
  """The model, the devices, the data and what the work directory holds."""
  experiment, config = run.experiment, run.experiment.train
  workdir = FLAGS.workdir
  devices = jax.devices()
  say(f"model: {setup.describe_model(experiment)}")
  say(f"devices: {len(devices)} {devices[0].platform} in "
      f"{jax.process_count()} process(es); mesh "
      f"{shd.describe(run.trainer.mesh)}, rules {experiment.rules}")
  train_corpus, held_corpus = run.corpora
  if experiment.task == "classify":
    say(f"data: {experiment.data}: {len(train_corpus)} training examples, "
        f"{len(held_corpus)} held out, {train_corpus.num_classes} classes; "
        f"batch {config.batch_size} x {config.seq_len} tokens, "
        f"{config.steps} steps")
  else:
    masked = " (masked)" if experiment.task == "mlm" else ""
    say(f"data: {experiment.data}{masked}: "
        f"{train_corpus.num_tokens / 1e6:.1f}M training tokens in "
        f"{train_corpus.num_documents} documents, "
        f"{held_corpus.num_tokens / 1e3:.0f}k held out; batch "
        f"{config.batch_size} x {config.seq_len} tokens, {config.steps} "
        "steps")
  if run.resume_step is None:
    say(f"workdir: {workdir} (new run)")
  elif run.resume_step >= config.steps:
    say(f"workdir: {workdir} holds the finished run (step "
        f"{run.resume_step} of {config.steps}): evaluating and sampling "
        "only; --config.train.steps=N with a larger N trains further")
  else:
    say(f"workdir: {workdir} holds a checkpoint at step {run.resume_step}: "
        f"resuming to step {config.steps}")


def initial_params(run: Run, say):
  """``(params, rest)`` of ``--init_from`` for a new run (parameters and
  non-parameter state, the routers' selection biases included), else
  ``(None, None)``."""
  if not FLAGS.init_from:
    return None, None
  if run.resume_step is not None:
    say("--init_from is ignored: the run resumes from its own checkpoint")
    return None, None
  try:
    params, rest, where = workdirs.source_state(FLAGS.init_from, run.trainer)
  except (ValueError, OSError) as error:
    raise setup.FlagError("init_from", str(error)) from None
  say(f"starting from the parameters in {where}")
  return params, rest


class Reporter:
  """The callback of ``fit``: TensorBoard events, progress, held-out
  losses and the periodic samples, with the time each kind took."""

  def __init__(self, run: Run, console, events, sampler):
    self.run, self.console, self.events = run, console, events
    self.sampler = sampler
    self.first_step_seconds = None
    self.eval_seconds, self.sample_seconds = [], []
    self.last = time.perf_counter()

  def sample(self, params, rest, step: int, heading: str) -> None:
    """A greedy sample, printed under ``heading`` and sent to TensorBoard
    (nothing without a sampler: tasks other than lm)."""
    if self.sampler is None:
      return
    began = time.perf_counter()
    text = self.sampler(params, rest)
    self.sample_seconds.append(time.perf_counter() - began)
    self.console.message(f"{heading}:\n{setup.indented(text)}")
    self.events.text("sample", text, step)

  def __call__(self, record, state) -> None:
    now = time.perf_counter()
    self.events.write(record)
    step, experiment = record["step"], self.run.experiment
    if "loss" in record:
      if self.first_step_seconds is None:
        self.first_step_seconds = record["seconds"]
      self.console.step(record)
      every = experiment.sample_every
      if every and step % every == 0 and step < experiment.train.steps:
        self.sample(state.params, state.rest, step, f"sample at step {step}")
    elif "eval_loss" in record:
      self.eval_seconds.append(now - self.last)
      value, unit = held_out(record, experiment.task)
      per_token = ("" if record.get("eval_bytes") == record["eval_tokens"]
                   or unit != "bits/byte" else
                   f"{record['eval_bits_per_token']:.3f} bits/token, ")
      self.console.message(
          f"step {step}: held-out {value:.3f} {unit} ({per_token}loss "
          f"{record['eval_loss']:.4f} nats/"
          f"{'example' if experiment.task == 'classify' else 'token'})")
    self.last = time.perf_counter()


def export(run: Run, state) -> tuple[str | None, str | None]:
  """``(directory, params path)`` of the final model, or ``(None, None)``
  when the run has nowhere shared to write it."""
  export_dir = FLAGS.export_dir or (FLAGS.workdir if jax.process_count() == 1
                                    else None)
  if not export_dir:
    return None, None
  params = workdirs.export_model(export_dir, run.trainer, state)
  workdirs.export_tokenizer(run.experiment.tokenizer, export_dir)
  return export_dir, params


def plot(run: Run, metrics: str) -> tuple[str, bool]:
  """``(path, drawn)`` of the loss plot (process 0 draws it)."""
  experiment = run.experiment
  path = workdirs.join(FLAGS.workdir, PLOT_FILE)
  mixers = ", ".join(dict.fromkeys(experiment.model.layer_mixers))
  drawn = jax.process_index() == 0 and run_output.plot_losses(
      metrics, path, experiment.train.tokens_per_step,
      f"{FLAGS.workdir}: {mixers}, d_model {experiment.model.d_model}",
      run.unit.replace("/", " per "))
  return path, drawn


def summarize(run: Run, say, *, seconds: float, reporter: Reporter,
              console, checkpoint: str, metrics: str, plotted, events,
              exported) -> None:
  """The closing lines: times, held-out losses, and the files written."""
  steps = run.experiment.train.steps
  evals = [r for r in run_output.read_metrics(metrics)
           if "eval_bits_per_token" in r]
  steady = sorted(console.recent)[len(console.recent) // 2] \
      if console.recent else 0.0
  say("")
  say(f"done: step {steps} in {run_output.duration(seconds)} "
      f"(first step, compiling the train step: "
      f"{reporter.first_step_seconds or 0:.1f} s; steps after it: "
      f"{steady * 1e3:.0f} ms each; evaluations: "
      f"{sum(reporter.eval_seconds):.1f} s; samples: "
      f"{sum(reporter.sample_seconds):.1f} s)")
  if evals:
    task = run.experiment.task
    (first, unit), (last, last_unit) = (held_out(evals[0], task),
                                        held_out(evals[-1], task))
    if unit != last_unit:
      # A run resumed across the change of its held-out unit.
      first, last = (evals[0]["eval_bits_per_token"],
                     evals[-1]["eval_bits_per_token"])
      unit = run.unit
    say(f"held-out {unit}: {first:.3f} at step {evals[0]['step']} -> "
        f"{last:.3f} at step {evals[-1]['step']}")
  plot_path, drawn = plotted
  say(f"checkpoint:  {checkpoint}")
  say(f"metrics:     {metrics}")
  say(f"plot:        {plot_path}" if drawn else
      "plot:        not drawn (matplotlib missing: pip install -e "
      "'.[analysis]')")
  say(f"tensorboard: {events.directory}" if events.available else
      "tensorboard: not written (tensorboardX missing: pip install -e "
      "'.[tensorboard]')")
  export_dir, params_dir = exported
  if params_dir:
    say(f"model:       {params_dir} (+ config.json" + (
        f"; --init_from={export_dir} starts a new run from it)"
        if run.experiment.task == "lm" else ")"))
  say(f"resume or extend: python -m experiments.train "
      f"--workdir={FLAGS.workdir} --config.train.steps={2 * steps}")


def train(run: Run) -> None:
  """Trains, evaluates and samples ``run``, then exports, plots and sums
  it up."""
  began = time.perf_counter()
  lead = jax.process_index() == 0
  workdir, experiment = FLAGS.workdir, run.experiment
  config = experiment.train
  console = run_output.Console(
      config.steps, min(run.resume_step or 0, config.steps),
      config.tokens_per_step, mode=FLAGS.progress,
      log_every=experiment.log_every, enabled=lead)
  say = console.message
  if lead:
    os.makedirs(workdir, exist_ok=True)
  workdirs.write_json(workdirs.join(workdir, workdirs.EXPERIMENT_FILE),
                      {"preset": run.preset,
                       "settings": experiment.to_dict()})
  announce(run, say)
  init_params, init_rest = initial_params(run, say)
  events = run_output.EventWriter(workdirs.join(workdir, EVENTS_DIR),
                                  enabled=lead)
  sampler = (setup.Sampler(run.trainer, experiment)
             if experiment.task == "lm" else None)
  reporter = Reporter(run, console, events, sampler)
  train_rows, heldout_rows = setup.training_rows(experiment, run.corpora)
  try:
    result = fit(run.trainer, train_rows,
                 workdir=workdir, checkpoint_dir=run.checkpoint_dir,
                 heldout_rows=heldout_rows,
                 eval_every=experiment.eval_every,
                 eval_batches=experiment.eval_batches,
                 callbacks=[reporter], log=say, init_params=init_params,
                 init_rest=init_rest,
                 eval_at_start=True, token_bytes=run.token_bytes)
  finally:
    console.close()
  seconds = time.perf_counter() - began

  params, where = workdirs.checkpoint_params(run.checkpoint_dir, run.trainer)
  reporter.sample(params, result.state.rest, config.steps,
                  f"sample from the checkpoint {where} (greedy, "
                  f"{experiment.sample_tokens} tokens)")
  events.close()
  exported = export(run, result.state)
  metrics = workdirs.join(workdir, METRICS_FILE)
  plotted = plot(run, metrics)
  if lead:
    summarize(run, say, seconds=seconds, reporter=reporter, console=console,
              checkpoint=where, metrics=metrics, plotted=plotted,
              events=events, exported=exported)


def main(argv):
  if not FLAGS["verbosity"].present:
    # Orbax and JAX log every checkpoint and backend at INFO.
    logging.set_verbosity(logging.WARNING)
  config_flags.no_arguments(argv)
  try:
    if FLAGS.multihost and FLAGS.coordinator_address is None:
      jax.distributed.initialize()
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                           FLAGS.process_id)
  except ValueError as error:
    config_flags.fail(str(setup.FlagError("num_processes", str(error))))
  if FLAGS.compilation_cache:
    jax.config.update("jax_compilation_cache_dir", FLAGS.compilation_cache)
  if FLAGS.show_config:
    try:
      experiment = setup.resolve(configs.get(FLAGS.config),
                                 task_overrides())
    except ValueError as error:
      config_flags.fail(str(error))
    print("\n".join(config_flags.describe(experiment)))
    return
  try:
    train(prepare())
  except setup.FlagError as error:
    config_flags.fail(str(error))


if __name__ == "__main__":
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES))
