"""Times this tree against another checkout of it, in one process.

On a shared machine the speed of the whole machine moves by tens of percent
between runs, so two runs of a benchmark (before and after a change)
compare the days as much as the code. This script imports the library and
``experiments`` from ``--other`` first, compiles what it times, then does
the same from this tree, and times both in interleaved rounds (each turn
an untimed then a timed run). With a checkout of an older commit:

  git worktree add /tmp/before 18a160b5
  python -m experiments.compare_trees --other=/tmp/before \\
      --step_mixers=linear_attn,rwkv7,kda --step_shape=2x4096
  python -m experiments.compare_trees --other=/tmp/before --step_mixers= \\
      --chunk_ops=kda,rwkv7 --op_length=8192

Each tree's packages are loaded from their folders by file location
(``importlib``), not through ``sys.path``.

``--step_mixers``: the LM train step of ``bench_train_step.py`` (its model
flags at their defaults); prints the minimum step time in each tree, its
ratio to the first mixer of this tree, and the loss after the last step
(equal in both trees when the change is exact). ``--chunk_ops``: forward and
backward of each op's chunk form on the inputs of ``bench_forms.py`` (B=1,
H=4, K=V=64, float32); prints the minimum time in each tree and this
tree's time over the other's.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from absl import app, flags

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_string("other", None, "Root of the other checkout.",
                    required=True)
flags.DEFINE_list("step_mixers", ["linear_attn", "rwkv7"],
                  "Mixers whose train step to time; the first is the "
                  "reference of the ratios.")
flags.DEFINE_string("step_shape", "2x4096",
                    "Batch x length of the train step.")
flags.DEFINE_list("chunk_ops", [], "Ops whose chunk form to time.")
flags.DEFINE_integer("op_length", 8192, "T of the ops.")
flags.DEFINE_integer("op_chunk_size", 64, "Chunk size of the ops.")
flags.DEFINE_integer("compare_rounds", 8, "Timed rounds.")
FLAGS = flags.FLAGS

_PACKAGES = ("lin_attn_jax", "experiments", "pallas_kernels")


def _load_packages(root):
  """Replaces the packages of ``_PACKAGES`` in ``sys.modules`` by those in
  ``root``: each is loaded from ``root/<package>/__init__.py`` with its
  submodules searched in that folder, so that later imports of them (and
  of their submodules) are from ``root``."""
  for name in [m for m in sys.modules if m.split(".")[0] in _PACKAGES]:
    del sys.modules[name]
  for package in _PACKAGES:
    folder = os.path.join(root, package)
    init = os.path.join(folder, "__init__.py")
    if not os.path.exists(init):
      continue
    spec = importlib.util.spec_from_file_location(
        package, init, submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module
    spec.loader.exec_module(module)


def _import_from(root, module, then=None):
  """``module`` (and the library under it) imported from ``root``; with
  ``then``, returns ``then(module)`` instead, called before another tree's
  modules replace these (an import that ``then`` makes is from ``root``
  too). Every module of the packages loaded by then must be from
  ``root``."""
  _load_packages(root)
  loaded = importlib.import_module(module)
  result = loaded if then is None else then(loaded)
  for name, mod in list(sys.modules.items()):
    path = getattr(mod, "__file__", None)
    if (name.split(".")[0] in _PACKAGES and path is not None and not
        os.path.abspath(path).startswith(os.path.abspath(root) + os.sep)):
      raise RuntimeError(f"imported {path}, not from {root}")
  return result


def _registry_module(root):
  """The module holding ``all_specs`` and ``Dims`` in the tree at ``root``:
  ``lin_attn_jax.ops.registry``, or ``experiments.specs`` in trees from
  before the registry moved into the library (``Dims`` then in its
  ``base``)."""
  if os.path.exists(os.path.join(root, "lin_attn_jax", "ops", "registry.py")):
    return "lin_attn_jax.ops.registry", "lin_attn_jax.ops.registry"
  return "experiments.specs", "experiments.specs.base"


def _op_run(root, name, bench_utils):
  """A no-argument run of the compiled forward+backward of ``name``'s chunk
  form, from the tree at ``root`` (compiled by this tree's
  ``bench_utils.compile_form``, as ``bench_forms.py`` does). The spec
  modules are imported, and the form traced and compiled, before any
  other tree's modules replace them."""
  import jax  # pylint: disable=g-import-not-at-top

  table, dims_module = _registry_module(root)

  def compile_op(specs):
    dims = importlib.import_module(dims_module).Dims
    spec = specs.all_specs()[name]
    inputs = spec.make_inputs(jax.random.PRNGKey(0),
                              dims(1, FLAGS.op_length, 4, 64, 64), False)
    inputs["segment_ids"] = None
    return bench_utils.compile_form(spec, "chunk", inputs,
                                    FLAGS.op_chunk_size)[1]

  return _import_from(root, table, compile_op)


def main(argv):
  del argv
  trees = (("other", os.path.abspath(FLAGS.other)), ("this", _HERE))

  def interleaved_min(runs):
    bench_utils = _import_from(_HERE, "experiments.bench_utils")
    return bench_utils.interleaved_min_times(runs, FLAGS.compare_rounds)
  if FLAGS.step_mixers:
    batch, length = (int(x) for x in FLAGS.step_shape.split("x"))
    runners = {}
    for tree, root in trees:
      bench = _import_from(root, "experiments.bench_train_step")
      for name in FLAGS.step_mixers:
        runners[tree, name] = bench.Runner(name, batch, length)
        print(f"{tree} {name}: compiled in "
              f"{runners[tree, name].compile_s:.1f} s", flush=True)

    def step(runner):
      def run():
        runner.run()
        return ()
      return run

    best = interleaved_min({key: step(r) for key, r in runners.items()})
    reference = best["this", FLAGS.step_mixers[0]]
    print(f"Train step, B={batch}, T={length}: minimum of "
          f"{FLAGS.compare_rounds} interleaved rounds; ratios to "
          f"{FLAGS.step_mixers[0]} of this tree")
    for (tree, name), runner in runners.items():
      t = best[tree, name]
      print(f"{tree:5s} {name:20s} {t * 1e3:7.0f} ms  {t / reference:5.2f}x"
            f"  loss {runner.loss:.5f}")
  if FLAGS.chunk_ops:
    bench_utils = _import_from(_HERE, "experiments.bench_utils")
    runs = {(tree, name): _op_run(root, name, bench_utils)
            for tree, root in trees for name in FLAGS.chunk_ops}
    best = interleaved_min(runs)
    print(f"Chunk forms, forward+backward, T={FLAGS.op_length}, chunks of "
          f"{FLAGS.op_chunk_size}: minimum of {FLAGS.compare_rounds} "
          "interleaved rounds")
    for name in FLAGS.chunk_ops:
      print(f"{name:20s} other {best['other', name] * 1e3:7.0f} ms  this "
            f"{best['this', name] * 1e3:7.0f} ms  this / other "
            f"{best['this', name] / best['other', name]:.3f}")


if __name__ == "__main__":
  app.run(main)
