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
