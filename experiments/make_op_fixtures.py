"""Regenerates the op reference fixtures of tests/ops (``tests/fixtures/ops``).

For every op whose definition comes from an outside reference (fla's
``naive.py``, or a paper's equations written in NumPy), one ``<name>.npz``
holding random inputs and the reference's outputs (and, where the
reference has them, final states and gradients), in float32. The tests
run the library's naive form on the same inputs and compare; the fixtures
need nothing but NumPy to read.

Needs the ``hf`` extra (CPU torch, flash-linear-attention) for the fla
references:

  pip install -e '.[hf]'
  python -m experiments.make_op_fixtures --only=NAME

Each entry of ``FIXTURES`` is a function ``() -> dict`` of NumPy arrays;
the arrays go into ``<out>/<name>.npz`` as they are.
"""

from __future__ import annotations

import os

from absl import app, flags
import numpy as np

FLAGS = flags.FLAGS
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "..",
                                        "tests", "fixtures", "ops"),
                    "Directory of the fixtures (one .npz per entry).")
flags.DEFINE_list("only", [], "Make only these fixtures (names as in "
                  "FIXTURES).")

SEED = 0
FIXTURES = {}


def fixture(name: str):
  """Registers ``fn`` as the maker of ``<name>.npz``."""
  def register(fn):
    FIXTURES[name] = fn
    return fn
  return register


# Stick-breaking attention: the cases of the fixture, as (name, query scale,
# attend_current). A query scale of 30 saturates the logits (|z| ~ 30).
STICKBREAKING_CASES = (("plain", 1.0, False), ("current", 1.0, True),
                       ("strong", 30.0, False), ("strong_current", 30.0,
                                                 True))


@fixture("stickbreaking_attn")
def stickbreaking_attn():
  """fla's ``naive_stickbreaking_attn`` on grouped heads (4 query heads, 2
  key/value heads), K != V, T = 19, for each case of
  ``STICKBREAKING_CASES``: ``<case>_{q,k,v}`` (float32), its ``o`` and
  ``rem``, and the gradients ``d{q,k,v}`` of ``sum(o * do) + sum(rem *
  drem)`` for the stored cotangents. The reference runs in float64 on the
  float32 inputs (fla's naive form keeps float64 inputs in float64)."""
  import torch
  from fla.ops.stickbreaking_attn.naive import naive_stickbreaking_attn

  rng = np.random.default_rng(SEED)
  b, t, h, hkv, dk, dv = 2, 19, 4, 2, 8, 6
  arrays = {}
  for name, q_scale, attend_current in STICKBREAKING_CASES:
    inputs = {"q": q_scale * rng.standard_normal((b, t, h, dk)),
              "k": rng.standard_normal((b, t, hkv, dk)),
              "v": rng.standard_normal((b, t, hkv, dv)),
              "do": rng.standard_normal((b, t, h, dv)),
              "drem": rng.standard_normal((b, t, h))}
    inputs = {n: x.astype(np.float32) for n, x in inputs.items()}
    q, k, v = (torch.tensor(inputs[n], dtype=torch.float64,
                            requires_grad=True) for n in ("q", "k", "v"))
    o, rem = naive_stickbreaking_attn(q, k, v, attend_current=attend_current)
    loss = ((o * torch.tensor(inputs["do"], dtype=torch.float64)).sum()
            + (rem * torch.tensor(inputs["drem"], dtype=torch.float64)).sum())
    loss.backward()
    outputs = {"o": o, "rem": rem, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    for n, x in {**inputs, **outputs}.items():
      arrays[f"{name}_{n}"] = np.asarray(
          x.detach().numpy() if isinstance(x, torch.Tensor) else x,
          np.float32)
  return arrays
def _fla_forgetting_attn(rng, *, batch, length, heads, heads_kv, dim,
                         window_size, scale):
  """Random inputs and fla's ``naive_forgetting_attn`` of them."""
  from fla.ops.forgetting_attn.naive import naive_forgetting_attn

  q = rng.standard_normal((batch, length, heads, dim), np.float32)
  k = rng.standard_normal((batch, length, heads_kv, dim), np.float32)
  v = rng.standard_normal((batch, length, heads_kv, dim), np.float32)
  logits = rng.standard_normal((batch, length, heads), np.float32) + 1.0
  g = -np.logaddexp(0.0, -logits).astype(np.float32)        # log sigmoid
  o = naive_forgetting_attn(*(torch.from_numpy(x) for x in (q, k, v, g)),
                            scale=scale, window_size=window_size)
  return dict(q=q, k=k, v=v, g=g, o=o.numpy(), scale=np.float32(scale),
              window=np.int64(window_size or 0))


@fixture("forgetting_attn")
def forgetting_attn():
  """fla's ``naive_forgetting_attn`` (``fla/ops/forgetting_attn/naive.py``)
  with four query heads on two key/value heads: ``full`` causal attention
  over 45 tokens, and a ``window`` of 7 over 40 (``window=0``: none)."""
  cases = {
      "full": _fla_forgetting_attn(rng, batch=2, length=45, heads=4,
                                   heads_kv=2, dim=16, window_size=None,
                                   scale=0.25),
      "window": _fla_forgetting_attn(rng, batch=2, length=40, heads=4,
                                     heads_kv=2, dim=8, window_size=7,
                                     scale=0.3),
  }
  return {f"{case}_{name}": x for case, arrays in cases.items()
          for name, x in arrays.items()}


@fixture("nsa")
def nsa():
  """fla's ``naive_nsa`` on random inputs: ``dense_*`` two rows of 37
  tokens, 32 query heads in 2 groups of 16 (the group size fla's NSA
  asserts), blocks of 4, 5 selected, a window of 5; ``docs_*`` one row of
  three documents (``cu_seqlens``, as ``segment_ids`` for the library),
  16 query heads on one key/value head, 4 selected, a window of 6. Gates
  are sigmoids, the scale the default."""
  import torch
  from experiments.fla_nsa_reference import naive_nsa_on_cpu
  naive_nsa = naive_nsa_on_cpu()
  rng = np.random.default_rng(SEED)
  arrays = {}
  for name, (b, t, h, hkv, counts, window, lengths) in {
      "dense": (2, 37, 32, 2, 5, 5, None),
      "docs": (1, 41, 16, 1, 4, 6, (11, 19, 11))}.items():
    dk, dv, block = 8, 6, 4
    x = {"q": rng.standard_normal((b, t, h, dk)),
         "k": rng.standard_normal((b, t, hkv, dk)),
         "v": rng.standard_normal((b, t, hkv, dv))}
    for gate in ("g_cmp", "g_slc", "g_swa"):
      x[gate] = 1 / (1 + np.exp(-rng.standard_normal((b, t, h))))
    x = {n: a.astype(np.float32) for n, a in x.items()}
    cu_seqlens = None
    if lengths is not None:
      cu_seqlens = torch.tensor(np.cumsum((0,) + lengths))
      x["segment_ids"] = np.repeat(np.arange(len(lengths)),
                                   lengths)[None].astype(np.int32)
    o = naive_nsa(*(torch.from_numpy(x[n]) for n in ("q", "k", "v", "g_cmp",
                                                     "g_slc", "g_swa")),
                  block_counts=counts, block_size=block, window_size=window,
                  cu_seqlens=cu_seqlens)
    x.update(o=o.numpy(), block_size=np.int64(block),
             block_counts=np.int64(counts), window_size=np.int64(window))
    arrays.update({f"{name}_{n}": a for n, a in x.items()})
  return arrays


def main(argv):
  del argv
  names = FLAGS.only or sorted(FIXTURES)
  os.makedirs(FLAGS.out, exist_ok=True)
  for name in names:
    arrays = FIXTURES[name]()
    path = os.path.join(FLAGS.out, f"{name}.npz")
    np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})
    print(f"wrote {path}: {', '.join(sorted(arrays))}")


if __name__ == "__main__":
  app.run(main)
