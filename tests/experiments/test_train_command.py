"""``python -m experiments.train`` end to end: a few steps on one CPU
device and on eight in two processes, resuming and extending through the
command line, starting from another run's parameters, the files a run
leaves, the dotted config overrides and the one-line errors naming the
field, and the Cloud TPU launcher's dry run; the same config path in
``experiments.compare`` (and a tiny comparison), ``experiments.mqar`` and
``experiments.generate``."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import compare, config_flags, configs, workdirs
from experiments import train_setup as setup
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.train.loop import METRICS_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = ["-m", "experiments.train"]
LAUNCH = ["-m", "experiments.tpu.launch"]
OPTIONS = {"gla": {"chunk_size": 8},
           "sliding_window_attn": {"window_size": 8, "block_size": 8}}
# Settings of a run (flags a resumed run or one started from --init_from
# may give again) and of its model (which those may not change).
SETTINGS = ["--config.train.batch_size=8", "--config.train.seq_len=16",
            "--config.train.warmup_steps=1", "--config.eval_every=2",
            "--config.eval_batches=1", "--config.sample_every=2",
            "--config.sample_tokens=4", "--config.train.checkpoint_every=2",
            "--progress=lines", "--config.log_every=1"]
MODEL = ["--config.model.d_model=16", "--config.model.n_layers=2",
         "--config.model.n_heads=2",
         "--config.model.mixer=gla,sliding_window_attn",
         f"--config.model.mixer_options={json.dumps(OPTIONS)}"]
TINY = MODEL + SETTINGS


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """One persistent compilation cache for the runs of this module."""
  return str(tmp_path_factory.mktemp("xla_cache"))


def train(workdir, *flags, devices=1, cache=None, preset=TINY, timeout=600):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count="
             f"{devices}")
  command = [sys.executable, *TRAIN, f"--workdir={workdir}", *preset, *flags]
  if cache:
    command.append(f"--compilation_cache={cache}")
  return subprocess.run(command, env=env, capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT)


def ok(done) -> str:
  assert done.returncode == 0, done.stdout + done.stderr[-4000:]
  return done.stdout


def records(workdir) -> list[dict]:
  with open(os.path.join(workdir, METRICS_FILE)) as f:
    return [json.loads(line) for line in f if line.strip()]


def test_one_device_run_resume_and_init_from(tmp_path, cache):
  first = tmp_path / "first"
  out = ok(train(first, "--config.train.steps=2", cache=cache))
  assert "(new run)" in out and "1 cpu in 1 process(es)" in out
  assert "step 0: held-out" in out and "step 2: held-out" in out
  assert "sample from the checkpoint" in out and "/checkpoints/2" in out
  rows = records(first)
  assert [r["step"] for r in rows if "loss" in r] == [1, 2]
  assert [r["step"] for r in rows if "eval_loss" in r] == [0, 2]
  for name in ("loss.png", "config.json", "experiment.json",
               "checkpoints/2", "params", "tensorboard"):
    assert (first / name).exists(), name
  assert any(f.startswith("events") for f in os.listdir(first /
                                                         "tensorboard"))

  # Resume and extend through the command line: only the steps are given;
  # the model and the other settings come from the work directory.
  out = ok(train(first, "--config.train.steps=4", cache=cache, preset=()))
  assert "holds a checkpoint at step 2: resuming to step 4" in out
  assert "resuming from the checkpoint at step 2" in out
  assert "sample at step 2" not in out
  rows = records(first)
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
  assert [r["step"] for r in rows if "eval_loss" in r] == [0, 2, 4]
  stored = json.load(open(first / "experiment.json"))
  assert stored["settings"]["train"]["steps"] == 4
  final = rows[-1]["eval_loss"]

  # A new run from the exported model (config.json + params/): its step-0
  # held-out loss is the source's final one (same parameters, same
  # held-out batches).
  second = tmp_path / "second"
  out = ok(train(second, "--config.train.steps=1", f"--init_from={first}",
                 cache=cache, preset=SETTINGS))
  assert f"starting from the parameters in {first}/params" in out
  start = [r for r in records(second) if "eval_loss" in r][0]
  assert start["step"] == 0 and start["eval_loss"] == pytest.approx(
      final, rel=1e-5)

  # From a training work directory: its newest checkpoint's parameters,
  # the same as the export's.
  experiment = setup.resolve(
      configs.get("tiny"), {"train.batch_size": "8", "train.seq_len": "16"},
      workdirs.source_model_config(str(first)), "")
  trainer = setup.build_trainer(experiment)
  exported, _ = workdirs.source_params(str(first), trainer)
  os.remove(first / "config.json")
  restored, where = workdirs.source_params(str(first), trainer)
  assert where == f"{first}/checkpoints/4"
  for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_eight_devices_in_two_processes(tmp_path):
  """Two processes with four CPU devices each train on one mesh."""
  from tests.train.test_train import free_port
  address = f"localhost:{free_port()}"
  env = dict(os.environ,
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  processes = [subprocess.Popen(
      [sys.executable, *TRAIN, f"--workdir={tmp_path / 'run'}", *TINY,
       "--config.train.steps=2", "--config.mesh=data=2,fsdp=4",
       f"--coordinator_address={address}", "--num_processes=2",
       f"--process_id={i}"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  outputs = [p.communicate(timeout=600) for p in processes]
  for p, (out, err) in zip(processes, outputs):
    assert p.returncode == 0, out + err[-4000:]
  assert ("8 cpu in 2 process(es); mesh data=2,fsdp=4,expert=1,tensor=1,"
          "sequence=1" in outputs[0][0])
  assert "held-out" in outputs[0][0] and "held-out" not in outputs[1][0]
  assert "sample from the checkpoint" in outputs[0][0]
  assert [r["step"] for r in records(tmp_path / "run") if "loss" in r] == \
      [1, 2]


def test_bad_flags_are_one_line_errors(tmp_path):
  done = train(tmp_path / "bad", "--config.model.mixer=gla,nope")
  assert done.returncode == 2
  assert done.stderr.strip().splitlines() == [
      "train.py: error: --config.model.mixer: unknown mixer(s) ['nope']; "
      f"known: {sorted(MIXERS)}"]
  done = train(tmp_path / "bad", "--config.model.widht=8", preset=())
  assert done.returncode == 2
  assert done.stderr.startswith(
      "train.py: error: --config.model.widht: LMConfig has no field "
      "'widht'; its fields: vocab_size, d_model,")


@pytest.mark.parametrize("overrides, field, words", [
    ({"model.mixer": "gla,nope"}, "model.mixer", "unknown mixer"),
    ({"model.d_model": "wide"}, "model.d_model", "must be an int, got 'wide'"),
    ({"model.n_layers": "3"}, "model.n_layers",
     "mixer has 4 names, which does not divide n_layers = 3"),
    ({"model.width": "8"}, "model.width", "LMConfig has no field 'width'"),
    ({"train.batch_size": "16", "train.grad_accum": "3"}, "train.grad_accum",
     "not divisible by grad_accum 3"),
    ({"model.n_layers": "2", "model.mixer": "gla,gla,gla"},
     "model.n_layers / --config.model.mixer",
     "mixer has 3 names, which does not divide n_layers = 2"),
    ({"model.mixer_options": "{gla"}, "model.mixer_options", "is not JSON"),
    ({"model.mixer_options": "[1]"}, "model.mixer_options",
     "must be a JSON object"),
    ({"model.mixer_options.gla.chunk_size": "8",
      "model.mixer_options.nope.x": "1"}, "model.mixer_options.nope.x",
     "mixer_options names unknown mixer(s) ['nope']"),
    ({"model.d_model.x": "1"}, "model.d_model.x", "is not a mapping"),
    ({"model.tie_embeddings": "maybe"}, "model.tie_embeddings",
     "must be true or false"),
    ({"model.dtype": "float16"}, "model.dtype", "must be one of"),
    ({"rules": "zero"}, "rules", "unknown rules"),
    ({"data": "web"}, "data", "must be stdlib, text:GLOB"),
    ({"eval_batches": "0"}, "eval_batches", "must be an int >= 1"),
    ({"mesh": "data=3"}, "mesh", "needs 3 devices, but there are 8"),
    ({"mesh": "data=2,fsdp=-1", "train.batch_size": "6"}, "mesh",
     "batch_size 6 (in 1 micro-batches of 6) is not divisible by data x "
     "fsdp x expert = 8"),
    ({"mesh": "fsdp=2,tensor=4", "rules": "fsdp_tp", "model.n_heads": "2"},
     "mesh", "not divisible by the tensor mesh axis"),
])
def test_errors_name_the_dotted_field(overrides, field, words):
  with pytest.raises(setup.FlagError) as caught:
    experiment = setup.resolve(configs.get("tiny"), overrides)
    setup.build_trainer(experiment)
  assert caught.value.flag == f"config.{field}"
  assert str(caught.value).startswith(f"--config.{field}: ")
  assert words in str(caught.value)


# A tiny encoder run of each task (the task given by --task, its model's
# fields by --config.model.*).
ENCODER = ["--config.model.d_model=16", "--config.model.n_layers=1",
           "--config.model.n_heads=2", "--config.model.mixer=linear_attn",
           "--config.model.max_len=16"] + SETTINGS


@pytest.mark.parametrize("task, flags, unit", [
    ("classify", ["--config.data=synthetic:examples=64",
                  "--config.model.num_classes=4"], "% accuracy"),
    pytest.param("mlm", [], "bits/byte", marks=pytest.mark.slow),
])
def test_encoder_task_runs_and_resumes(tmp_path, cache, task, flags, unit):
  workdir = tmp_path / task
  out = ok(train(workdir, f"--task={task}", "--config.train.steps=2",
                 *flags, cache=cache, preset=ENCODER))
  model = "Classifier" if task == "classify" else "MaskedLM"
  assert f"model: {model}, " in out and "(new run)" in out
  assert "step 2: held-out" in out and unit in out
  assert "sample" not in out.replace("samples: 0.0 s", "")
  stored = json.load(open(workdir / "experiment.json"))["settings"]
  assert stored["task"] == task
  assert (workdir / "checkpoints/2").exists()

  out = ok(train(workdir, "--config.train.steps=3", cache=cache, preset=()))
  assert "holds a checkpoint at step 2: resuming to step 3" in out
  assert f"model: {model}, " in out
  rows = records(workdir)
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
  assert all(np.isfinite(r["loss"]) for r in rows if "loss" in r)
  if task == "classify":
    assert all(0 <= r["eval_accuracy"] <= 1 for r in rows
               if "eval_loss" in r)

  other = "mlm" if task == "classify" else "classify"
  done = train(workdir, f"--task={other}", cache=cache, preset=())
  assert done.returncode == 2 and f"trains task {task!r}" in done.stderr


def test_task_picks_the_model_config():
  tiny = configs.get("tiny")
  experiment = setup.resolve(tiny, {
      "model.num_classes": "10", "model.pooling": "cls",
      "task": "classify", "data": "listops:examples=100",
      "train.seq_len": "64"})
  model = experiment.model
  assert type(model).__name__ == "ClassifierConfig"
  assert (model.num_classes, model.pooling, model.d_model) == (
      10, "cls", tiny.model.d_model)
  assert configs.Experiment.from_dict(experiment.to_dict()) == experiment
  train_set, held = setup.load_corpora(experiment)
  assert (len(train_set), train_set.seq_len, held.seq_len) == (100, 64, 64)
  rows, _ = setup.training_rows(experiment, (train_set, held))
  batch = rows.batch([0, 1])
  assert batch["inputs"].shape == (2, 64) and batch["targets"].shape == (2,)
  mlm = setup.resolve(tiny, {"task": "mlm"})
  assert type(mlm.model).__name__ == "MLMConfig"
  assert "MaskedLM, " in setup.describe_model(mlm)
  assert "M parameters" in setup.describe_model(tiny)
  for overrides, field, words in (
      ({"task": "classify"}, "task", "data must be listops"),
      ({"task": "mlm", "data": "synthetic"}, "data", "must not be"),
      ({"model.num_classes": "3"}, "model.num_classes", "no field"),
      ({"task": "vision"}, "task", "task must be one of")):
    with pytest.raises(setup.FlagError) as caught:
      setup.resolve(tiny, overrides)
    assert caught.value.flag == f"config.{field}" and words in str(
        caught.value), caught.value
  small_classes = setup.resolve(tiny, {
      "task": "classify", "data": "listops", "model.num_classes": "4",
      "train.seq_len": "64"})
  with pytest.raises(setup.FlagError, match="num_classes >= 10"):
    setup.load_corpora(small_classes)
  pathfinder = setup.resolve(tiny, {
      "task": "classify", "data": "pathfinder", "train.seq_len": "64"})
  with pytest.raises(setup.FlagError, match="rows of 1024 tokens"):
    setup.load_corpora(pathfinder)


def test_dotted_overrides():
  argv = ["train", "--workdir=w", "--config=tiny", "--config.train.steps=7",
          "--config.model.mixer=gla,sliding_window_attn",
          "--config.model.mixer_options.gla.chunk_size=16",
          "--config.model.embed_scale=2.5", "--config.model.mlp_dim=none",
          "--config.model.dtype=bfloat16", "--config.prompt=class ",
          "--config.train.async_checkpoints=false", "--config.model.mlp_bias"]
  rest, overrides = config_flags.split_overrides(argv)
  assert rest == ["train", "--workdir=w", "--config=tiny"]
  assert overrides["model.mlp_bias"] is None
  tiny = configs.get("tiny")
  experiment = setup.resolve(tiny, overrides)
  assert experiment.train == dataclasses.replace(
      tiny.train, steps=7, async_checkpoints=False)
  model = experiment.model
  assert model.mixer == ("gla", "sliding_window_attn")
  assert model.options_for("gla") == {"chunk_size": 16}
  assert model.options_for("sliding_window_attn") == \
      tiny.model.options_for("sliding_window_attn")
  assert (model.embed_scale, model.mlp_dim, model.mlp_bias) == (2.5, None,
                                                                True)
  assert model.dtype == jnp.bfloat16 and experiment.prompt == "class "
  assert setup.resolve(tiny, {"model.mixer": "gla"}).model.mixer == "gla"
  whole = setup.resolve(tiny, {"model.mixer_options": '{"gla": {}}'})
  assert dict(whole.model.mixer_options) == {"gla": ()}
  lines = config_flags.describe(experiment)
  assert "--config.train.steps=7" in lines
  assert "--config.model.mixer_options.gla.chunk_size=16" in lines
  again = dict(line[len("--config."):].split("=", 1) for line in lines)
  assert setup.resolve(tiny, again) == experiment


def test_show_config_prints_the_overridden_preset():
  done = subprocess.run(
      [sys.executable, *TRAIN, "--show_config", "--config=small",
       "--config.model.d_model=256"], capture_output=True, text=True,
      timeout=300, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-4000:]
  lines = done.stdout.splitlines()
  assert "--config.model.d_model=256" in lines
  assert "--config.model.n_layers=12" in lines


def test_resumed_model_is_fixed():
  model = configs.get("tiny").model
  with pytest.raises(setup.FlagError, match=r"--config.model.d_model: the "
                     r"checkpoint in X fixes the model \(d_model = 128\); "
                     r"drop the flag"):
    setup.resolve(configs.get("tiny"), {"model.d_model": "64"}, model,
                  "the checkpoint in X")
  same = setup.resolve(configs.get("tiny"), {"model.d_model": "128",
                                             "model.dtype": "bfloat16"},
                       model, "X")
  assert same.model.d_model == 128 and same.model.dtype != model.dtype


def test_presets_and_source_errors(tmp_path):
  for name in configs.PRESETS:
    assert configs.get(name).to_dict() == configs.Experiment.from_dict(
        configs.get(name).to_dict()).to_dict()
  with pytest.raises(ValueError, match="holds neither config.json"):
    workdirs.source_kind(str(tmp_path))


def test_compare_config_takes_dotted_overrides():
  quick = config_flags.from_preset(compare.PRESETS, "quick", {})
  assert quick == config_flags.from_preset(compare.PRESETS, "default", {
      "model.d_model": "64", "model.n_layers": "2", "train.steps": "120",
      "eval_every": "20", "eval_batches": "4", "mixers": ",".join(
          ("gla", "retnet", "hgrn2", "mamba2", "gated_deltanet", "rwkv6",
           "sliding_window_attn", "softmax_attn"))})
  for name, config in compare.PRESETS.items():
    assert compare.Comparison.from_dict(config.to_dict()) == config, name
    lines = config_flags.describe(config)
    again = dict(line[len("--config."):].split("=", 1) for line in lines)
    assert config_flags.apply_overrides(config, again) == config, name
  config = config_flags.from_preset(compare.PRESETS, "default", {
      "mixers": "gla", "chunk_size": "16", "window": "8",
      "model.mixer_options.gla.gate_low_rank_dim": "8"})
  assert config.mixers == ("gla",)
  assert config.model_config("gla").options_for("gla") == {
      "chunk_size": 16, "gate_low_rank_dim": 8}
  assert config.model_config("sliding_window_attn").mixer_options == (
      ("sliding_window_attn", (("window_size", 8),)),)
  assert config.model_config("softmax_attn").mixer_options == ()
  for overrides, field, words in [
      ({"mixers": "gla,nope"}, "mixers", "unknown mixer(s) ['nope']"),
      ({"decode_tokens": "1"}, "decode_tokens", "must be an int >= 2"),
      ({"train.steps": "many"}, "train.steps", "must be an int"),
      ({"steps": "10"}, "steps", "Comparison has no field 'steps'")]:
    with pytest.raises(config_flags.FlagError) as caught:
      config_flags.from_preset(compare.PRESETS, "default", overrides)
    assert str(caught.value).startswith(f"--config.{field}: ")
    assert words in str(caught.value)


def test_compare_trains_and_times_each_mixer():
  config = config_flags.from_preset(compare.PRESETS, "default", {
      "mixers": "gla,sliding_window_attn", "model.d_model": "16",
      "model.n_layers": "1", "train.steps": "2", "train.batch_size": "2",
      "train.seq_len": "16", "eval_every": "1", "eval_batches": "1",
      "repeats": "1", "decode_tokens": "3", "chunk_size": "8",
      "window": "8"})
  rows = compare.compare(config)
  assert sorted(r["mixer"] for r in rows) == ["gla", "sliding_window_attn"]
  for row in rows:
    assert [x for x, _ in row["curve"]] == [0, 32, 64]
    assert row["bits_per_byte"] < row["start_bits_per_byte"]
    assert len(row["step_seconds"]) == len(row["decode_seconds_per_token"]) \
        == 1
  floats = {r["mixer"]: r["state_floats_per_layer"] for r in rows}
  assert floats["sliding_window_attn"] > floats["gla"]
  lines = compare.table_lines(config, rows, "python -m experiments.compare")
  assert lines[0] == "Command: `python -m experiments.compare`"
  assert lines[2].startswith("1 layers of one mixer, d_model 16, 4 heads")
  assert "2 steps of 2 x 16 tokens" in lines[2]
  assert [line.split(" | ")[0] for line in lines[6:8]] == [
      f"| {r['mixer']}" for r in rows]
  assert lines[8:] in ([], [
      "", "—: decoding 3 tokens did not time longer than decoding one (the "
      "difference was within the timing noise)."])


@pytest.mark.parametrize("script, argv, error", [
    ("compare", ["--config.mixers=gla,nope"],
     f"--config.mixers: unknown mixer(s) ['nope']; known: {sorted(MIXERS)}"),
    ("compare", ["--config=paper"],
     "--config: unknown preset 'paper'; presets: default, quick"),
    ("mqar", ["--config.d_models=64,x"],
     "--config.d_models: item 'x' is not an int"),
    ("generate", ["--config.model.n_heads=0"],
     "--config.model.n_heads: n_heads must be a positive int, got 0"),
    ("generate", ["--workdir=w", "--config.model.d_model=8"],
     "--config.model.d_model: the model is --workdir's (w/config.json); "
     "drop the flag"),
])
def test_experiment_commands_name_the_bad_field(script, argv, error):
  done = subprocess.run([sys.executable, "-m", f"experiments.{script}",
                         *argv], capture_output=True, text=True,
                        timeout=300, cwd=ROOT)
  assert done.returncode == 2
  assert done.stderr.strip().splitlines()[-1] == f"{script}.py: error: " \
      f"{error}"


def launch(*args):
  done = subprocess.run([sys.executable, *LAUNCH, *args, "--dry_run"],
                        capture_output=True, text=True, timeout=120,
                        cwd=ROOT)
  assert done.returncode == 0, done.stderr
  return done.stdout.splitlines()


def test_tpu_launcher_dry_run():
  common = ["--name=slice", "--zone=us-east5-a", "--accelerator=v5litepod-16"]
  assert launch("create", *common, "--spot") == [
      "gcloud compute tpus tpu-vm create slice --zone=us-east5-a "
      "--accelerator-type=v5litepod-16 --version=v2-alpha-tpuv5-lite --spot"]
  setup_lines = launch("setup", *common)
  assert setup_lines[0].startswith("git -C ") and "archive" in setup_lines[0]
  assert "--worker=all" in setup_lines[1] and "scp" in setup_lines[1]
  assert '.venv/bin/pip install -q -c constraints.txt -e ".[tpu]"' in \
      setup_lines[2]
  (line,) = launch("train", *common, "--bucket=gs://b/runs", "--run=r1",
                   "--train_flags=--config.train.steps=10")
  for part in ("ssh slice", "--worker=all", "-m experiments.train",
               "--config=pod", "--checkpoint_dir=gs://b/runs/r1/checkpoints",
               "--multihost", "--config.train.steps=10", "~/runs/r1.log"):
    assert part in line, part
  watch = launch("watch", *common, "--bucket=gs://b/runs", "--run=r1")
  assert watch[0].endswith("describe slice --zone=us-east5-a "
                           "'--format=value(state)'")
  assert any(" delete slice " in w for w in watch)
  assert any(" create slice " in w for w in watch)
  assert "experiments.train" in watch[-1]
  gpu = launch("gpu", "--run=g", "--config=small")
  assert gpu[-1] == (".venv/bin/python -m experiments.train --config=small "
                     "--workdir=runs/g --config.mesh=fsdp=-1")


def test_progress_bar_and_lines():
  import io
  from experiments import run_output
  records_ = [{"step": s, "loss": 3.0 - s / 10, "seconds": 0.1 if s > 1
               else 5.0} for s in range(1, 5)]
  stream = io.StringIO()
  bar = run_output.Console(4, 0, 1000, mode="bar", stream=stream)
  for record in records_[:2]:
    bar.step(record)
  bar.message("held-out 2.5")
  bar.step(records_[3])
  bar.close()
  text = stream.getvalue()
  assert "\r\033[K" in text and "#" in text and "10.0k tok/s" in text
  assert "\r\033[Kheld-out 2.5\n" in text and "100%" in text
  lines = io.StringIO()
  plain = run_output.Console(4, 0, 1000, mode="auto", log_every=2,
                             stream=lines)
  for record in records_:
    plain.step(record)
  shown = lines.getvalue().splitlines()
  assert [line.split(" |")[0] for line in shown] == [
      "step 1/4", "step 2/4", "step 4/4"]
  assert "compiling" in shown[0] and "ETA 0:00" in shown[-1]
