"""Trains a language model: mesh, data, model, progress, evaluation,
samples, checkpoints, plots.

  python experiments/train.py --workdir=runs/tiny             # CPU default
  python experiments/train.py --workdir=runs/tiny --steps=1200   # extend it
  python experiments/train.py --config=small --workdir=runs/small \\
      --mixer=gla,gla,gla,sliding_window_attn --n_layers=12
  python experiments/train.py --workdir=runs/ft --init_from=CONVERTED_DIR
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
      python experiments/train.py --workdir=runs/x --mesh=data=2,fsdp=4

A preset (``--config``, the modules of ``experiments/configs/``) gives
every setting; the flags override it. A work directory that holds a
checkpoint resumes from it (and says so) with the run's own settings
(``experiment.json``): flags given again change the training settings
(``--steps`` extends the run), model flags must agree with the checkpoint.
``--init_from`` starts a new run from the parameters of a converted model
(``experiments/convert.py``: ``config.json`` + ``params/``) or of another
training run (its newest checkpoint); the model is then theirs.

On a terminal a progress bar shows the loss, tokens/s and the ETA (plain
lines otherwise). Held-out bits per token (per byte, with byte tokens) are
measured at the start, every ``--eval_every`` steps and at the end; a
greedy sample is printed every ``--sample_every`` steps and, at the end,
from the parameters read back from the saved checkpoint. The work directory
gets ``metrics.jsonl``, ``loss.png`` (matplotlib), ``tensorboard/``
(tensorboardX), the checkpoints, and the final model as ``config.json`` +
``params/``.

Several processes (TPU pod slices, GPU clusters, local CPU processes) run
the same command: ``--coordinator_address``, ``--num_processes`` and
``--process_id`` (or the ``JAX_*`` variables, or a cluster JAX detects).
Bad flags stop the run before anything is compiled, with one line naming
the flag.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402

from experiments import configs, run_output, workdirs  # noqa: E402
from experiments import train_setup as setup  # noqa: E402
from experiments.configs.base import Experiment  # noqa: E402
from lin_attn_jax import sharding as shd  # noqa: E402
from lin_attn_jax.data import PackedRows  # noqa: E402
from lin_attn_jax.data.corpus import BYTE_VOCAB  # noqa: E402
from lin_attn_jax.models.lm import REMAT_POLICIES  # noqa: E402
from lin_attn_jax.train import distributed  # noqa: E402
from lin_attn_jax.train.loop import METRICS_FILE, fit  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("config", "tiny", "Preset: " + ", ".join(configs.PRESETS)
                    + " (experiments/configs/).")
flags.DEFINE_string("workdir", None, "Checkpoints, metrics, plot and the "
                    "final model go here; a run resumes from its newest "
                    "checkpoint.")
flags.DEFINE_string("checkpoint_dir", None, "Checkpoints here instead of "
                    "WORKDIR/checkpoints (a shared path or gs://bucket/path "
                    "for multi-host runs).")
flags.DEFINE_string("init_from", None, "Start a new run from these "
                    "parameters: a directory of experiments/convert.py "
                    "(config.json + params/) or a training workdir.")
flags.DEFINE_string("export_dir", None, "Where the final model (config.json "
                    "+ params/) goes (default WORKDIR in a one-process run; "
                    "a multi-process run exports only when given a shared "
                    "path).")
flags.DEFINE_list("mixer", None, "Mixer of every layer, or one per layer "
                  "(a period that divides n_layers): names in "
                  "lin_attn_jax.layers.MIXERS.")
flags.DEFINE_integer("d_model", None, "Model width.")
flags.DEFINE_integer("n_layers", None, "Blocks.")
flags.DEFINE_integer("n_heads", None, "Heads per mixer.")
flags.DEFINE_integer("vocab_size", None, "Token ids (256 for bytes).")
flags.DEFINE_string("mixer_options", None, "JSON merged over the preset's, "
                    'e.g. \'{"gla": {"chunk_size": 32}}\'.')
flags.DEFINE_string("dtype", None, "Compute dtype: float32 or bfloat16 "
                    "(parameters and states stay float32).")
flags.DEFINE_string("remat", None, "Rematerialisation: " +
                    ", ".join(REMAT_POLICIES) + ".")
flags.DEFINE_integer("steps", None, "Optimizer steps of the run.")
flags.DEFINE_integer("batch_size", None, "Rows per step over all devices.")
flags.DEFINE_integer("seq_len", None, "Tokens per row.")
flags.DEFINE_integer("grad_accum", None, "Micro-batches per step.")
flags.DEFINE_float("learning_rate", None, "Peak learning rate.")
flags.DEFINE_integer("warmup_steps", None, "Linear warmup steps.")
flags.DEFINE_integer("seed", None, "Seed of the parameters and data order.")
flags.DEFINE_integer("checkpoint_every", None, "Steps between checkpoints "
                     "(0: only at the end).")
flags.DEFINE_string("mesh", None, "Mesh axes, e.g. fsdp=-1 or "
                    "data=2,fsdp=4 (axes data, fsdp, tensor, sequence).")
flags.DEFINE_string("rules", None, "Sharding rules: " +
                    ", ".join(shd.PRESETS) + ".")
flags.DEFINE_string("data", None, "stdlib, text:GLOB[,GLOB...] or "
                    "tokens:PATH[,dtype=uint16][,eos_id=N].")
flags.DEFINE_integer("eval_every", None, "Steps between held-out "
                     "evaluations (0: only at the start and the end).")
flags.DEFINE_integer("eval_batches", None, "Held-out batches per "
                     "evaluation.")
flags.DEFINE_integer("sample_every", None, "Steps between greedy samples "
                     "(0: only at the end).")
flags.DEFINE_integer("sample_tokens", None, "Tokens per sample.")
flags.DEFINE_string("prompt", None, "Prompt of the samples.")
flags.DEFINE_integer("log_every", None, "Steps between progress lines when "
                     "the output is not a terminal.")
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


def fail(message: str) -> None:
  """One line on stderr, exit status 2."""
  print(f"train.py: error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def given_flags() -> dict:
  """The override flags given (not None)."""
  names = setup.MODEL_FLAGS + setup.TRAIN_FLAGS + setup.RUN_FLAGS
  return {name: FLAGS[name].value for name in names
          if FLAGS[name].value is not None}


def prepare():
  """Flags -> (experiment, trainer, corpora, paths, resume step); raises
  ``FlagError``."""
  if not FLAGS.workdir:
    raise setup.FlagError("workdir", "is required: the directory of the "
                          "run's checkpoints, metrics and plot (e.g. "
                          "runs/tiny)")
  values = given_flags()
  try:
    base = configs.get(FLAGS.config)
  except ValueError as error:
    raise setup.FlagError("config", str(error)) from None
  workdir = FLAGS.workdir
  checkpoint_dir = workdirs.checkpoint_dir(workdir, FLAGS.checkpoint_dir)
  resume_step = workdirs.latest_checkpoint(checkpoint_dir)
  fixed_model, fixed_by = None, ""
  stored = workdirs.read_json(workdirs.join(workdir,
                                            workdirs.EXPERIMENT_FILE))
  if resume_step is not None:
    if stored is not None:
      if FLAGS["config"].present and stored["preset"] != FLAGS.config:
        raise setup.FlagError(
            "config", f"the run in {workdir} was started from preset "
            f"{stored['preset']!r} and resumes with its own settings; drop "
            "--config or use another --workdir")
      base = Experiment.from_dict(stored["settings"])
      fixed_model = base.model
    else:
      fixed_model = workdirs.stored_model_config(checkpoint_dir, resume_step)
    fixed_by = f"the checkpoint in {checkpoint_dir}"
  elif FLAGS.init_from:
    try:
      fixed_model = workdirs.source_model_config(FLAGS.init_from)
    except (ValueError, OSError) as error:
      raise setup.FlagError("init_from", str(error)) from None
    fixed_by = f"--init_from={FLAGS.init_from}"
  preset = stored["preset"] if (resume_step is not None and stored) \
      else FLAGS.config
  experiment = setup.resolve(base, values, fixed_model, fixed_by)
  trainer = setup.build_trainer(experiment)
  corpora = setup.load_corpora(experiment)
  return experiment, preset, trainer, corpora, checkpoint_dir, resume_step


def train(experiment, preset, trainer, corpora, checkpoint_dir,
          resume_step) -> None:
  began = time.perf_counter()
  lead = jax.process_index() == 0
  workdir = FLAGS.workdir
  config = experiment.train
  unit = ("bits/byte" if experiment.model.vocab_size == BYTE_VOCAB
          else "bits/token")
  start = min(resume_step or 0, config.steps)
  console = run_output.Console(
      config.steps, start, config.tokens_per_step, mode=FLAGS.progress,
      log_every=experiment.log_every, enabled=lead)
  say = console.message
  if lead:
    os.makedirs(workdir, exist_ok=True)
  workdirs.write_json(workdirs.join(workdir, workdirs.EXPERIMENT_FILE),
                      {"preset": preset, "settings": experiment.to_dict()})
  devices = jax.devices()
  say(f"model: {setup.describe_model(experiment)}")
  say(f"devices: {len(devices)} {devices[0].platform} in "
      f"{jax.process_count()} process(es); mesh "
      f"{shd.describe(trainer.mesh)}, rules {experiment.rules}")
  train_corpus, held_corpus = corpora
  say(f"data: {experiment.data}: {train_corpus.num_tokens / 1e6:.1f}M "
      f"training tokens in {train_corpus.num_documents} documents, "
      f"{held_corpus.num_tokens / 1e3:.0f}k held out; batch "
      f"{config.batch_size} x {config.seq_len} tokens, {config.steps} steps")
  if resume_step is None:
    say(f"workdir: {workdir} (new run)")
  elif resume_step >= config.steps:
    say(f"workdir: {workdir} holds the finished run (step {resume_step} of "
        f"{config.steps}): evaluating and sampling only; --steps=N with a "
        "larger N trains further")
  else:
    say(f"workdir: {workdir} holds a checkpoint at step {resume_step}: "
        f"resuming to step {config.steps}")
  init_params = None
  if FLAGS.init_from and resume_step is None:
    try:
      init_params, where = workdirs.source_params(FLAGS.init_from, trainer)
    except (ValueError, OSError) as error:
      raise setup.FlagError("init_from", str(error)) from None
    say(f"starting from the parameters in {where}")
  elif FLAGS.init_from:
    say("--init_from is ignored: the run resumes from its own checkpoint")

  events = run_output.EventWriter(workdirs.join(workdir, EVENTS_DIR),
                                  enabled=lead)
  sampler = setup.Sampler(trainer, experiment)
  timings = {"first_step": None, "eval": [], "sample": []}
  last = {"time": time.perf_counter()}

  def on_record(record, state):
    now = time.perf_counter()
    events.write(record)
    step = record["step"]
    if "loss" in record:
      if timings["first_step"] is None:
        timings["first_step"] = record["seconds"]
      console.step(record)
      if experiment.sample_every and step % experiment.sample_every == 0 \
          and step < config.steps:
        at = time.perf_counter()
        text = sampler(state.params, state.rest)
        timings["sample"].append(time.perf_counter() - at)
        say(f"sample at step {step}:\n{setup.indented(text)}")
        events.text("sample", text, step)
    elif "eval_loss" in record:
      timings["eval"].append(now - last["time"])
      say(f"step {step}: held-out {record['eval_bits_per_token']:.3f} {unit}"
          f" (loss {record['eval_loss']:.4f} nats/token)")
    last["time"] = time.perf_counter()

  try:
    result = fit(trainer, PackedRows(train_corpus, config.seq_len,
                                     seed=config.seed),
                 workdir=workdir, checkpoint_dir=checkpoint_dir,
                 heldout_rows=PackedRows(held_corpus, config.seq_len,
                                         seed=0),
                 eval_every=experiment.eval_every,
                 eval_batches=experiment.eval_batches,
                 callbacks=[on_record], log=say, init_params=init_params,
                 eval_at_start=True)
  finally:
    console.close()
  trained = time.perf_counter() - began

  params, where = workdirs.checkpoint_params(checkpoint_dir, trainer)
  at = time.perf_counter()
  text = sampler(params, result.state.rest)
  timings["sample"].append(time.perf_counter() - at)
  say(f"sample from the checkpoint {where} (greedy, "
      f"{experiment.sample_tokens} tokens):\n{setup.indented(text)}")
  events.text("sample", text, config.steps)
  events.close()

  export_dir = FLAGS.export_dir or (workdir if jax.process_count() == 1
                                    else None)
  exported = (workdirs.export_model(export_dir, trainer, result.state)
              if export_dir else None)
  metrics = workdirs.join(workdir, METRICS_FILE)
  plot = workdirs.join(workdir, PLOT_FILE)
  mixers = ", ".join(dict.fromkeys(experiment.model.layer_mixers))
  drawn = lead and run_output.plot_losses(
      metrics, plot, config.tokens_per_step,
      f"{workdir}: {mixers}, d_model {experiment.model.d_model}",
      unit.replace("/", " per "))
  if not lead:
    return
  evals = [r for r in run_output.read_metrics(metrics)
           if "eval_bits_per_token" in r]
  steady = sorted(console.recent)[len(console.recent) // 2] \
      if console.recent else 0.0
  say("")
  say(f"done: step {config.steps} in {run_output.duration(trained)} "
      f"(first step, compiling the train step: "
      f"{timings['first_step'] or 0:.1f} s; steps after it: "
      f"{steady * 1e3:.0f} ms each; evaluations: "
      f"{sum(timings['eval']):.1f} s; samples: "
      f"{sum(timings['sample']):.1f} s)")
  if evals:
    say(f"held-out {unit}: {evals[0]['eval_bits_per_token']:.3f} at step "
        f"{evals[0]['step']} -> {evals[-1]['eval_bits_per_token']:.3f} at "
        f"step {evals[-1]['step']}")
  say(f"checkpoint:  {where}")
  say(f"metrics:     {metrics}")
  say(f"plot:        {plot}" if drawn else
      "plot:        not drawn (matplotlib missing: pip install -e "
      "'.[analysis]')")
  say(f"tensorboard: {events.directory}" if events.available else
      "tensorboard: not written (tensorboardX missing: pip install -e "
      "'.[tensorboard]')")
  if exported:
    say(f"model:       {exported} (+ config.json; --init_from="
        f"{export_dir} starts a new run from it)")
  say(f"resume or extend: python experiments/train.py --workdir={workdir} "
      f"--steps={2 * config.steps}")


def parse_flags(argv):
  try:
    return FLAGS(argv)
  except flags.Error as error:
    fail(str(error).splitlines()[0])


def main(argv):
  if not FLAGS["verbosity"].present:
    # Orbax and JAX log every checkpoint and backend at INFO.
    logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    fail(f"unexpected arguments {argv[1:]} (flags look like --name=value)")
  try:
    if FLAGS.multihost and FLAGS.coordinator_address is None:
      jax.distributed.initialize()
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                           FLAGS.process_id)
  except ValueError as error:
    fail(str(setup.FlagError("num_processes", str(error))))
  if FLAGS.compilation_cache:
    jax.config.update("jax_compilation_cache_dir", FLAGS.compilation_cache)
  try:
    train(*prepare())
  except setup.FlagError as error:
    fail(str(error))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
