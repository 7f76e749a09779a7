"""Runs ``python -m experiments.train`` on Cloud TPU VMs (one host or a
multi-host pod slice) and on one multi-GPU node; ``--dry_run`` prints the
exact commands instead of running them.

  python -m experiments.tpu.launch create --name=lin-attn \\
      --zone=us-central2-b --accelerator=v4-32 [--spot] [--project=P]
  python -m experiments.tpu.launch setup --name=lin-attn --zone=us-central2-b
  python -m experiments.tpu.launch train --name=lin-attn --zone=us-central2-b \\
      --bucket=gs://my-bucket/runs --run=pod1 --config=pod [--train_flags=...]
  python -m experiments.tpu.launch logs|status|delete --name=... --zone=...
  python -m experiments.tpu.launch watch ...   # the above, again after a
                                               # preemption (resumes)
  python -m experiments.tpu.launch gpu --run=small1 --config=small

- ``create``: ``gcloud compute tpus tpu-vm create`` (``--spot`` for a
  preemptible slice); the runtime image follows the TPU generation.
- ``setup``: the committed tree (``git archive HEAD``) is copied to every
  worker, which installs Python 3.11 and ``pip install -e '.[tpu]'`` (JAX
  with libtpu, and gcsfs for ``gs://`` paths) in ``~/lin_attn_jax/.venv``.
- ``train``: starts the training on every worker at once
  (``--worker=all``), in the background with its log in
  ``~/runs/RUN.log``; ``--multihost`` lets JAX find the slice's other
  hosts. Checkpoints and the final model go to
  ``BUCKET/RUN`` through orbax, metrics and plots to ``~/runs/RUN`` on
  worker 0.
- ``watch``: every ``--poll_seconds``, if the slice was preempted (or is
  gone), deletes it, creates it again, sets it up and starts training,
  which resumes from the newest checkpoint in the bucket; if it is up and
  the training has stopped without finishing, starts it again; stops when
  the log says ``done:``.
- ``gpu``: one node with several GPUs, on this machine: one process drives
  every local GPU (mesh ``fsdp=-1``), so no coordinator is needed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

from absl import app, flags

ACTIONS = ("create", "setup", "train", "logs", "status", "delete", "watch",
           "gpu")
# Cloud TPU runtime images by accelerator-type prefix (first match).
RUNTIME_VERSIONS = (("v6e", "v2-alpha-tpuv6e"),
                    ("v5litepod", "v2-alpha-tpuv5-lite"),
                    ("v5p", "v2-alpha-tpuv5"),
                    ("v4", "tpu-ubuntu2204-base"))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

FLAGS = flags.FLAGS
flags.DEFINE_string("name", "lin-attn", "TPU VM (slice) name.")
flags.DEFINE_string("zone", "us-central2-b", "Zone of the TPU VM.")
flags.DEFINE_string("project", None, "Cloud project (default: gcloud's).")
flags.DEFINE_string("accelerator", "v4-8", "Accelerator type, e.g. v4-8 "
                    "(one host), v4-32, v5litepod-16, v6e-16 (pod slices).")
flags.DEFINE_string("version", None, "TPU runtime image (default: by "
                    "accelerator generation).")
flags.DEFINE_bool("spot", False, "Create a Spot (preemptible) slice.")
flags.DEFINE_string("bucket", None, "gs:// prefix for checkpoints and the "
                    "final model (required by train and watch).")
flags.DEFINE_string("run", None, "Run name (default: --name).")
flags.DEFINE_string("config", "pod", "experiments.train preset.")
flags.DEFINE_string("train_flags", "", "More experiments.train flags, "
                    "e.g. '--config.train.steps=5000 "
                    "--config.data=tokens:/data/t.bin,dtype=uint16'.")
flags.DEFINE_string("remote_dir", "~/lin_attn_jax", "Checkout on the "
                    "workers.")
flags.DEFINE_integer("poll_seconds", 300, "watch: seconds between checks.")
flags.DEFINE_bool("dry_run", False, "Print the commands, run nothing.")


def runtime_version(accelerator: str) -> str:
  for prefix, version in RUNTIME_VERSIONS:
    if accelerator.startswith(prefix):
      return version
  raise app.UsageError(f"--accelerator={accelerator}: no default runtime "
                       "image; pass --version")


def _tpu(verb: str, *args: str) -> list[str]:
  command = ["gcloud", "compute", "tpus", "tpu-vm", verb, FLAGS.name,
             f"--zone={FLAGS.zone}"]
  if FLAGS.project:
    command.append(f"--project={FLAGS.project}")
  return command + list(args)


def _ssh(command: str, worker: str = "all") -> list[str]:
  return _tpu("ssh", f"--worker={worker}", f"--command={command}")


def run_name() -> str:
  return FLAGS.run or FLAGS.name


def create_commands() -> list[list[str]]:
  version = FLAGS.version or runtime_version(FLAGS.accelerator)
  extra = ["--spot"] if FLAGS.spot else []
  return [_tpu("create", f"--accelerator-type={FLAGS.accelerator}",
               f"--version={version}", *extra)]


def setup_commands() -> list[list[str]]:
  archive = "/tmp/lin_attn_jax.tar.gz"
  remote = FLAGS.remote_dir
  install = " && ".join([
      "set -e",
      "sudo apt-get update -qq",
      "sudo apt-get install -y -qq python3.11 python3.11-venv",
      f"mkdir -p {remote}",
      f"tar -xzf ~/lin_attn_jax.tar.gz -C {remote}",
      f"cd {remote}",
      "python3.11 -m venv .venv",
      '.venv/bin/pip install -q -c constraints.txt -e ".[tpu]"',
  ])
  return [["git", "-C", REPO, "archive", "--format=tar.gz",
           f"--output={archive}", "HEAD"],
          _tpu("scp", archive, f"{FLAGS.name}:~/lin_attn_jax.tar.gz",
               "--worker=all"),
          _ssh(install)]


def train_command_line() -> str:
  """The command every worker runs (in the background)."""
  if not FLAGS.bucket or not FLAGS.bucket.startswith("gs://"):
    raise app.UsageError("--bucket=gs://BUCKET/PATH is required: every "
                         "worker writes its checkpoint shards there")
  run = run_name()
  target = f"{FLAGS.bucket.rstrip('/')}/{run}"
  train = " ".join([
      ".venv/bin/python -m experiments.train",
      f"--config={FLAGS.config}",
      f"--workdir=$HOME/runs/{run}",
      f"--checkpoint_dir={target}/checkpoints",
      f"--export_dir={target}/export",
      "--multihost",
      "--progress=lines",
      FLAGS.train_flags,
  ]).strip()
  return (f"mkdir -p ~/runs && cd {FLAGS.remote_dir} && "
          f"(setsid nohup {train} > ~/runs/{run}.log 2>&1 &)")


def train_commands() -> list[list[str]]:
  return [_ssh(train_command_line())]


def logs_commands() -> list[list[str]]:
  return [_ssh(f"tail -n 40 ~/runs/{run_name()}.log", worker="0")]


def status_commands() -> list[list[str]]:
  return [_tpu("describe", "--format=value(state)")]


def delete_commands() -> list[list[str]]:
  return [_tpu("delete", "--quiet")]


def gpu_commands() -> list[list[str]]:
  run = run_name()
  return [["python3.11", "-m", "venv", ".venv"],
          [".venv/bin/pip", "install", "-q", "-c", "constraints.txt", "-e",
           ".[gpu]"],
          [".venv/bin/python", "-m", "experiments.train",
           f"--config={FLAGS.config}", f"--workdir=runs/{run}",
           "--config.mesh=fsdp=-1", *shlex.split(FLAGS.train_flags)]]


def show(command: list[str]) -> None:
  print(shlex.join(command), flush=True)


def execute(commands: list[list[str]], capture: bool = False) -> str:
  out = ""
  for command in commands:
    show(command)
    if FLAGS.dry_run:
      continue
    cwd = REPO if command[0].startswith(".venv") or command[0] == \
        "python3.11" else None
    done = subprocess.run(command, check=True, text=True, cwd=cwd,
                          capture_output=capture)
    out = done.stdout if capture else ""
  return out


def tpu_state() -> str:
  """READY, PREEMPTED, ..., or MISSING when the slice does not exist."""
  command = status_commands()[0]
  show(command)
  if FLAGS.dry_run:
    return "PREEMPTED"
  done = subprocess.run(command, text=True, capture_output=True)
  return done.stdout.strip() if done.returncode == 0 else "MISSING"


def worker0(command: str) -> str:
  ssh = _ssh(command, worker="0")
  show(ssh)
  if FLAGS.dry_run:
    return ""
  return subprocess.run(ssh, text=True, capture_output=True).stdout


def watch() -> None:
  """Keeps the run going through preemptions (see the module doc)."""
  run = run_name()
  train_command_line()
  while True:
    state = tpu_state()
    if state != "READY":
      print(f"{FLAGS.name} is {state}: creating it again; training resumes "
            "from the newest checkpoint in the bucket", flush=True)
      if state != "MISSING":
        execute(delete_commands())
      execute(create_commands() + setup_commands() + train_commands())
    else:
      log = worker0(f"tail -n 5 ~/runs/{run}.log; "
                    "pgrep -f experiments.train > /dev/null && "
                    "echo TRAINING")
      if "done:" in log:
        print(f"{run} finished", flush=True)
        return
      if "TRAINING" not in log:
        print("experiments.train is not running: starting it again (it "
              "resumes)", flush=True)
        execute(train_commands())
    if FLAGS.dry_run:
      return
    time.sleep(FLAGS.poll_seconds)


def main(argv):
  if len(argv) != 2 or argv[1] not in ACTIONS:
    raise app.UsageError(f"one action, of {', '.join(ACTIONS)}")
  action = argv[1]
  if action == "watch":
    watch()
    return
  commands = {"create": create_commands, "setup": setup_commands,
              "train": train_commands, "logs": logs_commands,
              "status": status_commands, "delete": delete_commands,
              "gpu": gpu_commands}[action]()
  execute(commands)


if __name__ == "__main__":
  sys.exit(app.run(main))
