"""experiments/train.py end to end: a few steps on one CPU device and on
eight in two processes, resuming and extending through the command line,
starting from another run's parameters, the files a run leaves, the
one-line errors of bad flags, and the Cloud TPU launcher's dry run."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import configs, workdirs
from experiments import train_setup as setup
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.train.loop import METRICS_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "experiments", "train.py")
LAUNCH = os.path.join(ROOT, "experiments", "tpu", "launch.py")
OPTIONS = {"gla": {"chunk_size": 8},
           "sliding_window_attn": {"window_size": 8, "block_size": 8}}
# Settings of a run (flags a resumed run or one started from --init_from
# may give again) and of its model (which those may not change).
SETTINGS = ["--batch_size=8", "--seq_len=16", "--warmup_steps=1",
            "--eval_every=2", "--eval_batches=1", "--sample_every=2",
            "--sample_tokens=4", "--checkpoint_every=2", "--progress=lines",
            "--log_every=1"]
MODEL = ["--d_model=16", "--n_layers=2", "--n_heads=2",
         "--mixer=gla,sliding_window_attn",
         f"--mixer_options={json.dumps(OPTIONS)}"]
TINY = MODEL + SETTINGS


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """One persistent compilation cache for the runs of this module."""
  return str(tmp_path_factory.mktemp("xla_cache"))


def train(workdir, *flags, devices=1, cache=None, preset=TINY, timeout=600):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count="
             f"{devices}")
  command = [sys.executable, TRAIN, f"--workdir={workdir}", *preset, *flags]
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
  out = ok(train(first, "--steps=2", cache=cache))
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

  # Resume and extend through the command line: only --steps is given;
  # the model and the other settings come from the work directory.
  out = ok(train(first, "--steps=4", cache=cache, preset=()))
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
  out = ok(train(second, "--steps=1", f"--init_from={first}", cache=cache,
                 preset=SETTINGS))
  assert f"starting from the parameters in {first}/params" in out
  start = [r for r in records(second) if "eval_loss" in r][0]
  assert start["step"] == 0 and start["eval_loss"] == pytest.approx(
      final, rel=1e-5)

  # From a training work directory: its newest checkpoint's parameters,
  # the same as the export's.
  experiment = setup.resolve(configs.get("tiny"), {},
                             workdirs.source_model_config(str(first)), "")
  experiment = dataclasses.replace(
      experiment, train=dataclasses.replace(experiment.train, batch_size=8,
                                            seq_len=16))
  trainer = setup.build_trainer(experiment)
  exported, _ = workdirs.source_params(str(first), trainer)
  os.remove(first / "config.json")
  restored, where = workdirs.source_params(str(first), trainer)
  assert where == f"{first}/checkpoints/4"
  for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(a, b)


def test_eight_devices_in_two_processes(tmp_path):
  """Two processes with four CPU devices each train on one mesh."""
  from tests.test_train import free_port
  address = f"localhost:{free_port()}"
  env = dict(os.environ,
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  processes = [subprocess.Popen(
      [sys.executable, TRAIN, f"--workdir={tmp_path / 'run'}", *TINY,
       "--steps=2", "--mesh=data=2,fsdp=4",
       f"--coordinator_address={address}", "--num_processes=2",
       f"--process_id={i}"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  outputs = [p.communicate(timeout=600) for p in processes]
  for p, (out, err) in zip(processes, outputs):
    assert p.returncode == 0, out + err[-4000:]
  assert ("8 cpu in 2 process(es); mesh data=2,fsdp=4,tensor=1,sequence=1"
          in outputs[0][0])
  assert "held-out" in outputs[0][0] and "held-out" not in outputs[1][0]
  assert "sample from the checkpoint" in outputs[0][0]
  assert [r["step"] for r in records(tmp_path / "run") if "loss" in r] == \
      [1, 2]


def test_bad_flags_are_one_line_errors(tmp_path):
  done = train(tmp_path / "bad", "--mixer=gla,nope")
  assert done.returncode == 2
  assert done.stderr.strip().splitlines() == [
      "train.py: error: --mixer: unknown mixer(s) ['nope']; known: "
      f"{sorted(MIXERS)}"]


@pytest.mark.parametrize("flags, flag, words", [
    ({"mixer": ["gla", "nope"]}, "mixer", "unknown mixer"),
    ({"mesh": "data=3"}, "mesh", "needs 3 devices, but there are 8"),
    ({"mesh": "data=2,fsdp=-1", "batch_size": 6}, "batch_size",
     "not divisible by data x fsdp = 8"),
    ({"mesh": "fsdp=2,tensor=4", "rules": "fsdp_tp", "n_heads": 2},
     "n_heads", "not divisible by the tensor mesh axis"),
    ({"rules": "zero"}, "rules", "unknown rules"),
    ({"data": "web"}, "data", "must be stdlib, text:GLOB"),
    ({"mixer_options": "{gla"}, "mixer_options", "is not JSON"),
    ({"grad_accum": 3}, "grad_accum", "not divisible by grad_accum 3"),
    ({"dtype": "float16"}, "dtype", "must be one of"),
])
def test_flag_errors_name_the_flag(flags, flag, words):
  with pytest.raises(setup.FlagError) as caught:
    experiment = setup.resolve(configs.get("tiny"), flags)
    setup.build_trainer(experiment)
  assert caught.value.flag == flag and words in str(caught.value)
  assert str(caught.value).startswith(f"--{flag}: ")


def test_resumed_model_is_fixed():
  model = configs.get("tiny").model
  with pytest.raises(setup.FlagError, match=r"--d_model: the checkpoint in "
                     r"X fixes the model \(d_model = 128\); drop the flag"):
    setup.resolve(configs.get("tiny"), {"d_model": 64}, model,
                  "the checkpoint in X")
  same = setup.resolve(configs.get("tiny"), {"d_model": 128, "dtype":
                                             "bfloat16"}, model, "X")
  assert same.model.d_model == 128 and same.model.dtype != model.dtype


def test_presets_and_source_errors(tmp_path):
  for name in configs.PRESETS:
    assert configs.get(name).to_dict() == configs.Experiment.from_dict(
        configs.get(name).to_dict()).to_dict()
  with pytest.raises(ValueError, match="holds neither config.json"):
    workdirs.source_kind(str(tmp_path))


def launch(*args):
  done = subprocess.run([sys.executable, LAUNCH, *args, "--dry_run"],
                        capture_output=True, text=True, timeout=120)
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
                   "--train_flags=--steps=10")
  for part in ("ssh slice", "--worker=all", "experiments/train.py",
               "--config=pod", "--checkpoint_dir=gs://b/runs/r1/checkpoints",
               "--multihost", "--steps=10", "~/runs/r1.log"):
    assert part in line, part
  watch = launch("watch", *common, "--bucket=gs://b/runs", "--run=r1")
  assert watch[0].endswith("describe slice --zone=us-east5-a "
                           "'--format=value(state)'")
  assert any(" delete slice " in w for w in watch)
  assert any(" create slice " in w for w in watch)
  assert "experiments/train.py" in watch[-1]
  gpu = launch("gpu", "--run=g", "--config=small")
  assert gpu[-1] == (".venv/bin/python experiments/train.py --config=small "
                     "--workdir=runs/g --mesh=fsdp=-1")


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
