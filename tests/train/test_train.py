"""Training: sharded steps equal one device, checkpoints restore on other
meshes, a killed run resumes on the same loss curve, several processes
train as one, and the loss, optimizer and data behave as documented."""

from __future__ import annotations

import functools
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax import sharding as shd
from lin_attn_jax.data import BatchSource, PackedRows, stdlib_corpus
from lin_attn_jax.models.lm import LM, LMConfig
from lin_attn_jax.train import Checkpointer, TrainConfig, Trainer, flops
from lin_attn_jax.train import distributed, loss, optim
from lin_attn_jax.train.loop import METRICS_FILE, fit
from tests.train import train_worker

HYBRID = ("gla", "gated_deltanet", "mamba2", "softmax_attn")
SMALL_CHUNKS = {name: {"chunk_size": 8} for name in HYBRID[:3]}
# Run from the repository root, so that ``-m`` finds the package.
WORKER = ["-m", "tests.train.train_worker"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = train_worker.FAST_COMPILE


@functools.cache
def train_rows(seq_len: int = 16) -> PackedRows:
  return PackedRows(stdlib_corpus("train"), seq_len, seed=0)


def configs(mixers=HYBRID, steps=3, **train_kw):
  model = LMConfig(vocab_size=256, d_model=16, n_layers=len(mixers),
                   n_heads=2, mixer=tuple(mixers),
                   mixer_options={k: v for k, v in SMALL_CHUNKS.items()
                                  if k in mixers})
  train = TrainConfig(**{**dict(batch_size=8, seq_len=16, steps=steps,
                                warmup_steps=1, learning_rate=1e-2),
                         **train_kw})
  return model, train


def run_steps(spec, rules, devices, mixers=HYBRID, steps=3, **train_kw):
  model, train = configs(mixers, steps, **train_kw)
  mesh = shd.make_mesh(spec, jax.devices()[:devices])
  trainer = Trainer(model, train, mesh=mesh, rules=rules,
                    compiler_options=FAST)
  state = trainer.init()
  source = BatchSource(train_rows(), train.batch_size)
  losses = []
  for step in range(steps):
    state, metrics = trainer.step(state, source.batch(step))
    losses.append(float(metrics["loss"]))
  return np.array(losses), state, trainer


def rel_rms(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.sqrt(np.mean((a - b) ** 2))
               / max(np.sqrt(np.mean(b ** 2)), 1e-30))


def worst_leaf_error(tree, reference) -> float:
  pairs = zip(jax.tree.leaves(jax.device_get(tree)),
              jax.tree.leaves(jax.device_get(reference)))
  return max(rel_rms(a, b) for a, b in pairs)


@functools.cache
def one_device_run(mixers=HYBRID):
  losses, state, _ = run_steps("fsdp=1", "dp", 1, mixers)
  return losses, jax.device_get(state.params)


def all_params_error(tree, reference) -> float:
  """Relative RMS error over every parameter at once."""
  pairs = list(zip(jax.tree.leaves(jax.device_get(tree)),
                   jax.tree.leaves(jax.device_get(reference))))
  err = sum(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64))
                   ** 2) for a, b in pairs)
  ref = sum(np.sum(np.asarray(b, np.float64) ** 2) for _, b in pairs)
  return float(np.sqrt(err / ref))


def check_sharded_equals_one_device(mixers, meshes, params_rtol=1e-5):
  """Losses and parameters after three steps equal one device's.

  The parameters' error is taken over all of them (``params_rtol``), and
  per tensor with 10x that: a zero-initialised bias holds only three AdamW
  updates, and an entry whose gradient is a sum that cancels to near zero
  gets its update's sign from float32 rounding, which the sharded sums
  order differently.
  """
  reference_losses, reference_params = one_device_run(mixers)
  for spec, rules in meshes:
    losses, state, trainer = run_steps(spec, rules, 8, mixers)
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-5,
                               err_msg=f"losses on {spec}")
    error = all_params_error(state.params, reference_params)
    assert error <= params_rtol, (spec, error)
    worst = worst_leaf_error(state.params, reference_params)
    assert worst <= 10 * params_rtol, (spec, worst)
    # The first layer's input projection (Mamba-2 has no q_proj).
    proj = "q_proj" if "q_proj" in state.params["blocks"][0]["mixer"] else (
        "in_proj")
    kernel = state.params["blocks"][0]["mixer"][proj]["kernel"][...]
    mu = state.opt_state[1][0].mu["blocks"][0]["mixer"][proj]["kernel"]
    full = kernel.shape
    shard = kernel.addressable_shards[0].data.shape
    mu_shard = mu[...].addressable_shards[0].data.shape
    expected = {"data=8": full, "data=2,sequence=4": full,
                "fsdp=8": (full[0] // 8, full[1]),
                "fsdp=4,tensor=2": (full[0] // 4, full[1] // 2)}[spec]
    assert shard == expected and mu_shard == expected, (spec, shard, mu_shard)


MESHES = (("data=8", "dp"), ("fsdp=8", "fsdp"), ("fsdp=4,tensor=2", "fsdp_tp"))


def test_sharded_training_equals_one_device_hybrid():
  """gla, gated_deltanet, mamba2 and softmax_attn, one layer each, on
  fsdp=4 x tensor=2. Data parallelism is in the data x sequence check
  below and the two-process runs; every mesh of MESHES for each mixer is
  the slow per-mixer check."""
  check_sharded_equals_one_device(HYBRID, (MESHES[2],))


def test_data_by_sequence_mesh_trains_as_one_device():
  """Batch rows over ``data`` and each row's tokens over ``sequence``: the
  chunk forms split the sequence by themselves (context parallelism; every
  core's split is checked in test_context_parallel.py)."""
  check_sharded_equals_one_device(("gla", "softmax_attn"),
                                  (("data=2,sequence=4", "dp"),))


@pytest.mark.slow
@pytest.mark.parametrize("mixer", HYBRID)
def test_sharded_training_equals_one_device_per_mixer(mixer):
  check_sharded_equals_one_device((mixer,), MESHES)


def test_accumulation_remat_and_bfloat16_compute():
  """Two micro-batches with rematerialised blocks give the step of one
  batch; bfloat16 compute keeps float32 parameters and close losses."""
  mixers = ("gla",)
  reference, ref_state, _ = run_steps("fsdp=1", "dp", 1, mixers, steps=2)
  model, train = configs(mixers, steps=2, grad_accum=2)
  model = LMConfig(**{**model.__dict__, "remat": "block"})
  trainer = Trainer(model, train, mesh=shd.make_mesh("fsdp=2",
                                                      jax.devices()[:2]),
                    rules="fsdp", compiler_options=FAST)
  state = trainer.init()
  source = BatchSource(train_rows(), train.batch_size)
  losses = []
  for step in range(2):
    state, metrics = trainer.step(state, source.batch(step))
    losses.append(float(metrics["loss"]))
  np.testing.assert_allclose(losses, reference, rtol=1e-5)
  assert worst_leaf_error(state.params, ref_state.params) <= 1e-5

  model, train = configs(mixers, steps=2)
  model = LMConfig(**{**model.__dict__, "dtype": jnp.bfloat16})
  trainer = Trainer(model, train, mesh=shd.make_mesh("fsdp=1",
                                                      jax.devices()[:1]),
                    compiler_options=FAST)
  state = trainer.init()
  state, metrics = trainer.step(state, source.batch(0))
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(
      state.params))
  assert abs(float(metrics["loss"]) - reference[0]) < 0.05 * reference[0]


def randomised(state, seed=0):
  """``state`` with every float leaf redrawn (same shardings)."""
  leaves, tree = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  out = []
  for key, leaf in zip(keys, leaves):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      value = jax.random.normal(key, leaf.shape, leaf.dtype)
      leaf = jax.device_put(value, leaf.sharding)
    out.append(leaf)
  return jax.tree.unflatten(tree, out)


def test_checkpoint_restores_onto_other_meshes(tmp_path):
  model, train = configs(("gla", "mamba2"))
  saver = Trainer(model, train, mesh=shd.make_mesh("fsdp=8"), rules="fsdp",
                  compiler_options=FAST)
  state = randomised(saver.init())
  checkpointer = Checkpointer(str(tmp_path), async_save=True)
  checkpointer.save(5, state, {"step": 5}, saver.config_record())
  checkpointer.close()
  saved = jax.device_get(state)
  for spec, rules, devices in (("fsdp=2,tensor=2", "fsdp_tp", 4),
                               ("fsdp=1", "dp", 1)):
    trainer = Trainer(model, train, rules=rules,
                      mesh=shd.make_mesh(spec, jax.devices()[:devices]),
                      compiler_options=FAST)
    restored, data, step = trainer.restore(Checkpointer(str(tmp_path)))
    assert (step, data["step"]) == (5, 5)
    for a, b in zip(jax.tree.leaves(jax.device_get(restored)),
                    jax.tree.leaves(saved)):
      np.testing.assert_array_equal(a, b)
    for leaf, sharding in zip(jax.tree.leaves(restored),
                              jax.tree.leaves(trainer.state_shardings)):
      assert leaf.sharding == sharding

  other = LMConfig(**{**model.__dict__, "d_model": 32})
  with pytest.raises(ValueError, match=r"another model \(d_model: "
                     r"checkpoint 16 vs 32\)"):
    Trainer(other, train, mesh=shd.make_mesh("fsdp=8")).restore(
        Checkpointer(str(tmp_path)))


def worker(workdir, steps, *extra, devices=2):
  return [sys.executable, *WORKER, f"--workdir={workdir}", f"--steps={steps}",
          f"--devices={devices}", "--mesh=fsdp=-1", *extra]


def run_worker(*args, **kw) -> str:
  done = subprocess.run(worker(*args, **kw), capture_output=True, text=True,
                        timeout=600, cwd=ROOT)
  assert done.returncode == 0, done.stdout + done.stderr
  return done.stdout


def losses_of(workdir) -> dict[int, float]:
  with open(os.path.join(workdir, METRICS_FILE)) as f:
    records = [json.loads(line) for line in f if line.strip()]
  steps = [r["step"] for r in records if "loss" in r]
  assert len(steps) == len(set(steps)), steps
  return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_killed_run_resumes_on_the_same_loss_curve(tmp_path):
  steps = 10
  cache = f"--compilation_cache={tmp_path / 'xla_cache'}"
  run_worker(tmp_path / "whole", steps, cache)
  reference = losses_of(tmp_path / "whole")
  assert sorted(reference) == list(range(1, steps + 1))

  # Killed at a random step once a checkpoint is complete (saving runs in
  # the background, so a kill may also land while one is being written).
  kill_at = random.Random().randint(3, 8)
  killed = tmp_path / "killed"
  process = subprocess.Popen(worker(killed, steps, cache), cwd=ROOT,
                             stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
  for line in process.stdout:
    step = int(line.split()[1]) if line.startswith("step ") else 0
    saved = [d for d in os.listdir(killed / "checkpoints") if d.isdigit()] \
        if (killed / "checkpoints").exists() else []
    if step >= kill_at and saved:
      process.send_signal(signal.SIGKILL)
      break
  process.wait(timeout=600)
  assert process.returncode == -signal.SIGKILL, (
      f"the run ended before a checkpoint was complete at step {kill_at}")
  resumed = run_worker(killed, steps, cache)
  assert "resuming from the checkpoint at step" in resumed, resumed
  got = losses_of(killed)
  assert sorted(got) == sorted(reference), (kill_at, sorted(got))
  for step, value in reference.items():
    assert abs(got[step] - value) <= 1e-6 * abs(value), (kill_at, step)

  # A corrupt latest checkpoint: the one before it is used, and the run
  # ends on the same curve.
  directory = killed / "checkpoints"
  latest = max(int(d) for d in os.listdir(directory) if d.isdigit())
  for root, _, files in os.walk(directory / str(latest) / "state"):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"not a checkpoint")
  os.remove(killed / METRICS_FILE)
  again = run_worker(killed, steps, cache)
  assert f"checkpoint at step {latest}" in again and "cannot be read" in again
  assert f"resuming from the checkpoint at step {latest - 2}" in again
  got = losses_of(killed)
  for step in range(latest - 1, steps + 1):
    assert abs(got[step] - reference[step]) <= 1e-6 * abs(reference[step])


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_train_as_one(tmp_path):
  steps = 3
  address = f"localhost:{free_port()}"
  processes = [subprocess.Popen(
      worker(tmp_path / "multi", steps, f"--coordinator={address}",
             "--num_processes=2", f"--process_id={i}", "--heldout",
             devices=4),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
      for i in range(2)]
  outputs = [p.communicate(timeout=600) for p in processes]
  for p, (out, err) in zip(processes, outputs):
    assert p.returncode == 0, out + err[-3000:]
  multi = losses_of(tmp_path / "multi")

  model, train = train_worker.model_and_train_config(steps)
  trainer = Trainer(model, train, mesh=shd.make_mesh("fsdp=8"),
                    compiler_options=FAST)
  rows = PackedRows(stdlib_corpus("train"), train.seq_len, seed=train.seed)
  result = fit(trainer, rows,
               heldout_rows=PackedRows(stdlib_corpus("heldout"),
                                       train.seq_len, seed=0),
               eval_batches=1, token_bytes=train_worker.held_out_bytes())
  single = [r["loss"] for r in result.history if "loss" in r]
  np.testing.assert_allclose([multi[s] for s in range(1, steps + 1)], single,
                             rtol=1e-5)
  # The held-out bytes add up over both processes' rows.
  with open(tmp_path / "multi" / METRICS_FILE) as f:
    evals = [r for r in map(json.loads, f) if "eval_loss" in r]
  assert evals[-1]["eval_bytes"] == result.last_eval["eval_bytes"]
  assert evals[-1]["eval_bytes"] > evals[-1]["eval_tokens"]
  np.testing.assert_allclose(evals[-1]["eval_bits_per_byte"],
                             result.last_eval["eval_bits_per_byte"],
                             rtol=1e-5)


def test_batches_are_a_pure_function_of_the_step():
  rows = train_rows()
  whole = BatchSource(rows, 8)
  for step in (0, 7, rows.rows_per_epoch // 8 + 1):
    batch = whole.batch(step)
    for parts in (2, 4):
      pieces = [BatchSource(rows, 8, np.arange(8)[p::parts]).batch(step)
                for p in range(parts)]
      for key, value in batch.items():
        merged = np.empty_like(value)
        for p, piece in enumerate(pieces):
          merged[p::parts] = piece[key]
        np.testing.assert_array_equal(merged, value)
  again = BatchSource(PackedRows(stdlib_corpus("train"), 16, seed=0), 8)
  iterator = again.iterator(5, 8)
  for step in range(5, 8):
    got = next(iterator)
    for key, value in whole.batch(step).items():
      np.testing.assert_array_equal(got[key], value)
  # A batch's rows lie S = rows_per_epoch // B apart (not one stretch of
  # one file), and an epoch's steps read every row once.
  long_rows = PackedRows(rows.corpus, 4096, seed=0)
  spread = BatchSource(long_rows, 8)
  steps = long_rows.rows_per_epoch // 8
  assert np.all(np.diff(spread.row_indices(3)) == steps)
  seen = np.concatenate([spread.row_indices(s) for s in range(steps)])
  assert len(np.unique(seen)) == len(seen) == steps * 8
  assert spread.row_indices(steps)[0] == long_rows.rows_per_epoch
  other_seed = BatchSource(PackedRows(rows.corpus, 16, seed=1), 8).batch(0)
  assert not np.array_equal(other_seed["inputs"], whole.batch(0)["inputs"])


def test_packed_rows_and_targets():
  rows = train_rows()
  tokens, segments = rows.rows(range(3))
  assert tokens.shape == segments.shape == (3, 17)
  # Consecutive rows continue the same stream of documents.
  order, ends = rows._epoch(0)
  doc = rows.corpus.document(int(order[0]))
  np.testing.assert_array_equal(tokens[0][:min(17, len(doc))],
                                doc[:min(17, len(doc))])
  batch = BatchSource(rows, 4).batch(0)
  seg, weights = batch["segment_ids"], batch["weights"]
  np.testing.assert_array_equal(batch["targets"][:, :-1],
                                batch["inputs"][:, 1:])
  crossing = np.concatenate([seg[:, 1:] != seg[:, :-1],
                             np.zeros((4, 1), bool)], axis=1)
  # weights[t] is 0 exactly where token t + 1 starts another document.
  next_seg = np.concatenate([seg[:, 1:], seg[:, -1:]], axis=1)
  assert np.all(weights[crossing & (next_seg != seg)] == 0)
  assert np.all(batch["positions"][np.concatenate(
      [np.ones((4, 1), bool), crossing[:, :-1]], axis=1)] == 0)


def test_heldout_split_is_stable_and_disjoint(tmp_path):
  for i in range(40):
    (tmp_path / f"doc{i}.txt").write_text(f"document {i}\n")
  pattern = str(tmp_path / "*.txt")
  from lin_attn_jax.data import text_corpus
  train = text_corpus(pattern, "train", heldout_fraction=0.25)
  held = text_corpus(pattern, "heldout", heldout_fraction=0.25)
  assert train.num_documents + held.num_documents == 40
  assert held.num_documents > 0
  assert text_corpus(pattern, "heldout", 0.25).fingerprint() == \
      held.fingerprint()
  with pytest.raises(ValueError, match="no file matches"):
    text_corpus(str(tmp_path / "*.none"))


def test_token_file_corpus(tmp_path):
  from lin_attn_jax.data import token_file_corpus
  tokens = np.array([5, 6, 0, 7, 8, 9, 0, 3], np.uint16)
  np.save(tmp_path / "t.npy", tokens)
  corpus = token_file_corpus(str(tmp_path / "t.npy"), eos_id=0, split="all")
  assert [list(corpus.document(i)) for i in range(3)] == [
      [5, 6, 0], [7, 8, 9, 0], [3]]
  tokens.astype(np.uint32).tofile(tmp_path / "t.bin")
  blocks = token_file_corpus(str(tmp_path / "t.bin"), dtype="uint32",
                             doc_len=3, split="all")
  assert list(blocks.lengths) == [3, 3, 2] and blocks.vocab_size == 10
  with pytest.raises(ValueError, match="needs dtype uint16 or uint32"):
    token_file_corpus(str(tmp_path / "t.bin"))


def test_loss_ignores_padding_and_document_boundaries():
  logits = jax.random.normal(jax.random.key(0), (2, 5, 7))
  tokens = jnp.array([[1, 2, 3, 4, 5, 6], [1, 2, 3, 0, 0, 0]])
  segments = jnp.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 0, 0, 0]])
  batch = loss.batch_targets(tokens, segments)
  np.testing.assert_array_equal(batch["weights"], [[1, 1, 0, 1, 1],
                                                   [1, 1, 0, 0, 0]])
  total, count, z = loss.cross_entropy_sums(logits, batch["targets"],
                                            batch["weights"], z_loss=1e-2)
  logp = jax.nn.log_softmax(logits)
  picked = np.take_along_axis(np.asarray(logp),
                              np.asarray(batch["targets"])[..., None], -1)
  mask = np.asarray(batch["weights"], bool)
  lse = np.asarray(jax.nn.logsumexp(logits, -1))
  expected_z = 1e-2 * np.sum(lse[mask] ** 2)
  np.testing.assert_allclose(float(count), 6)
  np.testing.assert_allclose(float(z), expected_z, rtol=1e-6)
  np.testing.assert_allclose(float(total),
                             -picked[..., 0][mask].sum() + expected_z,
                             rtol=1e-6)


def test_weight_decay_mask():
  config = LMConfig(vocab_size=64, d_model=16, n_layers=3, n_heads=2,
                    mixer=("mamba2", "rwkv6", "gla"))
  model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  mask = optim.weight_decay_mask(model)
  flat = {tuple(p): v for p, v in nnx.to_flat_state(mask)}
  decays = {p: bool(v.get_value() if hasattr(v, "get_value") else v)
            for p, v in flat.items()}
  assert decays[("embed", "embedding")]
  assert decays[("blocks", 0, "mixer", "in_proj", "kernel")]
  for name in ("A_log", "dt_bias", "D"):
    assert not decays[("blocks", 0, "mixer", name)], name
  for name in ("lerp_weights", "bonus", "decay_base"):
    assert not decays[("blocks", 1, "mixer", name)], name
  assert decays[("blocks", 1, "mixer", "lerp_down")]
  assert not decays[("blocks", 2, "mixer", "gate_up", "bias")]
  assert not decays[("blocks", 2, "mixer_norm", "scale")]


def test_learning_rate_schedule():
  schedule = optim.learning_rate_schedule(TrainConfig(
      steps=100, warmup_steps=10, learning_rate=1.0, min_lr_ratio=0.1))
  np.testing.assert_allclose([float(schedule(s)) for s in (0, 5, 10, 100)],
                             [0.0, 0.5, 1.0, 0.1], atol=1e-6)


def test_flops_per_token():
  d, vocab, t = 16, 64, 32
  config = LMConfig(vocab_size=vocab, d_model=d, n_layers=1, n_heads=2,
                    mixer="softmax_attn", mlp_dim=32)
  model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  # q, k, v, o projections, the SwiGLU MLP and the tied output head.
  matrix = 4 * d * d + 3 * d * 32 + vocab * d
  attention = 4 * (t + 1) / 2 * d
  assert flops.flops_per_token(model, t) == pytest.approx(
      3 * (2 * matrix + attention))
  gla = LMConfig(vocab_size=vocab, d_model=d, n_layers=1, n_heads=2,
                 mixer="gla")
  mixer = nnx.eval_shape(lambda: LM(gla, rngs=nnx.Rngs(0))).blocks[0].mixer
  # The state [H, K, V] = [2, 4, 8].
  assert flops.mixing_flops_per_token(mixer, t) == 4 * 2 * 4 * 8
  assert flops.peak_flops() is None and flops.mfu(1e6, 1e9) is None


def test_bad_training_settings():
  model, train = configs(("gla",), batch_size=6)
  with pytest.raises(ValueError, match=r"batch_size 6 \(in 1 micro-batches "
                     r"of 6\) is not divisible by data x fsdp x expert = 4"):
    Trainer(model, train, mesh=shd.make_mesh("data=2,fsdp=2,tensor=2"))
  with pytest.raises(ValueError, match="not divisible by grad_accum 4"):
    TrainConfig(batch_size=6, grad_accum=4)
  model, train = configs(("gla",))
  bad = LMConfig(**{**model.__dict__, "n_heads": 2, "d_model": 16})
  with pytest.raises(ValueError, match=r"n_heads = 2 is not divisible by "
                     r"the tensor mesh axis \(4\)"):
    Trainer(bad, train, mesh=shd.make_mesh("fsdp=2,tensor=4"),
            rules="fsdp_tp")
  with pytest.raises(ValueError, match="needs coordinator_address, "
                     "num_processes and process_id together"):
    distributed.initialize(num_processes=2)
  assert not distributed.initialize()


def test_fit_writes_metrics_and_evaluates(tmp_path):
  """A short fit with held-out evaluation; bits per token follow from the
  loss."""
  model, train = configs(("gla",), steps=2)
  trainer = Trainer(model, train, mesh=shd.make_mesh("fsdp=1",
                                                      jax.devices()[:1]),
                    compiler_options=FAST)
  held = PackedRows(stdlib_corpus("heldout"), 16, seed=0)
  seen = []
  result = fit(trainer, train_rows(), workdir=str(tmp_path),
               heldout_rows=held, eval_every=1, eval_batches=1,
               callbacks=[lambda record, state: seen.append(record)])
  evals = [r for r in result.history if "eval_loss" in r]
  assert [r["step"] for r in evals] == [1, 2]
  assert evals[-1]["eval_bits_per_token"] == pytest.approx(
      evals[-1]["eval_loss"] / math.log(2))
  assert seen == result.history
  records = [json.loads(line) for line in open(tmp_path / METRICS_FILE)]
  assert [r["step"] for r in records] == [1, 1, 2, 2]
  assert all(r["mfu"] is None for r in records if "loss" in r)
  assert os.listdir(tmp_path / "checkpoints") == ["2"]
