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
