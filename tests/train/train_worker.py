"""A tiny training run in its own process, for the tests that kill a run,
restart it, or start several processes.

  python -m tests.train.train_worker --workdir=DIR --steps=8 [--mesh=fsdp=-1]
      [--devices=N] [--coordinator=localhost:PORT --num_processes=2
      --process_id=0] [--compilation_cache=DIR] [--heldout]

Prints ``step <n> <loss>`` after every step (flushed), then ``done``. With
``--heldout`` the run ends with a held-out evaluation of one batch, in bits
per byte with ``HELD_OUT_BYTES`` as the bytes of each id.
"""

from __future__ import annotations

import argparse
import os


MIXERS = ("gla",)
# Tests compile many small programs: faster compilation, slower code.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def held_out_bytes():
  """Bytes per id for --heldout: 1, 2 or 3, so that a count of only some
  processes' rows, or of tokens, is off."""
  import numpy as np
  return np.arange(256) % 3 + 1


def model_and_train_config(steps: int, batch_size: int = 8, seq_len: int = 16,
                           mixers=MIXERS, checkpoint_every: int = 2):
  from lin_attn_jax.models.lm import LMConfig
  from lin_attn_jax.train import TrainConfig
  model = LMConfig(vocab_size=256, d_model=16, n_layers=len(mixers),
                   n_heads=2, mixer=tuple(mixers),
                   mixer_options={"gla": {"chunk_size": 8}})
  train = TrainConfig(batch_size=batch_size, seq_len=seq_len, steps=steps,
                      warmup_steps=2, learning_rate=1e-2,
                      checkpoint_every=checkpoint_every, checkpoint_keep=3)
  return model, train


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir")
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--mesh", default="fsdp=-1")
  parser.add_argument("--rules", default="fsdp")
  parser.add_argument("--devices", type=int, default=1)
  parser.add_argument("--coordinator")
  parser.add_argument("--num_processes", type=int)
  parser.add_argument("--process_id", type=int)
  parser.add_argument("--compilation_cache")
  parser.add_argument("--heldout", action="store_true")
  args = parser.parse_args()
  os.environ["XLA_FLAGS"] = (
      f"--xla_force_host_platform_device_count={args.devices}")
  if args.compilation_cache:
    # Runs of one test share their compiled programs (same programs, same
    # results: only the compile time is saved).
    import jax
    jax.config.update("jax_compilation_cache_dir", args.compilation_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

  from lin_attn_jax.train import distributed
  distributed.initialize(args.coordinator, args.num_processes,
                         args.process_id)
  from lin_attn_jax import sharding
  from lin_attn_jax.data import PackedRows, stdlib_corpus
  from lin_attn_jax.train import Trainer
  from lin_attn_jax.train.loop import fit

  model, train = model_and_train_config(args.steps)
  trainer = Trainer(model, train, mesh=sharding.make_mesh(args.mesh),
                    rules=args.rules, compiler_options=FAST_COMPILE)
  rows = PackedRows(stdlib_corpus("train"), train.seq_len, seed=train.seed)

  def report(record, state):
    del state
    if "loss" in record:
      print(f"step {record['step']} {record['loss']!r}", flush=True)

  heldout = None
  if args.heldout:
    heldout = PackedRows(stdlib_corpus("heldout"), train.seq_len, seed=0)
  fit(trainer, rows, workdir=args.workdir, callbacks=[report],
      log=lambda line: print(line, flush=True), heldout_rows=heldout,
      eval_batches=1, token_bytes=held_out_bytes() if args.heldout else None)
  print("done", flush=True)


if __name__ == "__main__":
  main()
