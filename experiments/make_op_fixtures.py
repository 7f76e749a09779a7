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


@fixture("path_attn")
def path_attn():
  """fla's ``naive_path_attn`` (its chunked UT-transform reference) on
  random inputs: T = 37 (not a multiple of its chunk of 16), 4 query heads
  on 2 key/value heads, with a forget gate (``o_gate``) and without one
  (``o``: fla's reference needs a gate, given as zeros), and the gradients
  of the gated output for a random cotangent ``do``."""
  import torch
  from fla.ops.path_attn.naive import naive_path_attn

  rng = np.random.default_rng(SEED)
  b, t, h, hkv, dk, dv, chunk = 2, 37, 4, 2, 8, 8, 16
  w = rng.standard_normal((b, t, hkv, dk))
  arrays = dict(
      q=rng.standard_normal((b, t, h, dk)),
      k=rng.standard_normal((b, t, hkv, dk)),
      v=rng.standard_normal((b, t, hkv, dv)),
      w=w / np.linalg.norm(w, axis=-1, keepdims=True),
      beta=2.0 / (1.0 + np.exp(-rng.standard_normal((b, t, hkv)))),
      g=-np.logaddexp(0.0, -rng.standard_normal((b, t, h))),
      do=rng.standard_normal((b, t, h, dv)))
  arrays = {n: x.astype(np.float32) for n, x in arrays.items()}
  scale = dk ** -0.5
  grads = ("q", "k", "v", "w", "beta", "g")
  inputs = {n: torch.tensor(arrays[n], requires_grad=n in grads)
            for n in ("q", "k", "v", "w", "beta", "g")}
  o_gate = naive_path_attn(**inputs, scale=scale, chunk_size=chunk)
  o_gate.backward(torch.tensor(arrays["do"]))
  with torch.no_grad():
    o = naive_path_attn(**{**inputs, "g": torch.zeros_like(inputs["g"])},
                        scale=scale, chunk_size=chunk)
  arrays.update(o=o.numpy(), o_gate=o_gate.detach().numpy(),
                scale=np.float32(scale))
  arrays.update({f"d{n}": inputs[n].grad.numpy() for n in grads})
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
