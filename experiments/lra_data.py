r"""Statistics of the generated Long Range Arena data (docs/training.md).

ListOps: time, token counts, operator depth (the deepest nesting of
brackets) and the label distribution; Pathfinder (32 and 64, the chosen
level): time, label balance, ink, and whether a flood fill over the ink,
bridging the dash gaps, joins the dots exactly when the label is 1.

  python -m experiments.lra_data --listops=2000 --pathfinder32=1024 \\
      --pathfinder64=256
"""

import collections
import time

from absl import app
from absl import flags
import numpy as np

from lin_attn_jax.data import lra

flags.DEFINE_integer("listops", 2000, "ListOps examples")
flags.DEFINE_integer("pathfinder32", 1024, "Pathfinder-32 images")
flags.DEFINE_integer("pathfinder64", 256, "Pathfinder-64 images")
flags.DEFINE_string("level", "hard", "Pathfinder level")
flags.DEFINE_integer("seed", 0, "data seed")
FLAGS = flags.FLAGS


def listops_report(count: int, seed: int) -> str:
  start = time.perf_counter()
  batch = lra.ListOps(count, seed=seed).batch(range(count))
  seconds = time.perf_counter() - start
  lengths = batch["segment_ids"].sum(axis=1)
  opens = (batch["inputs"] >= 11) & (batch["inputs"] <= 14)
  closes = batch["inputs"] == 15
  depth = np.cumsum(opens.astype(int) - closes, axis=1).max(axis=1)
  labels = collections.Counter(batch["labels"].tolist())
  shares = ", ".join(f"{k}: {100 * labels[k] / count:.1f} %"
                     for k in range(10))
  return (f"ListOps, {count} examples, {seconds:.1f} s: length mean "
          f"{lengths.mean():.0f}, 5/50/95th percentiles "
          f"{np.percentile(lengths, [5, 50, 95]).round().tolist()}, range "
          f"{lengths.min()}-{lengths.max()}; depth "
          f"{sorted(collections.Counter(depth.tolist()).items())}; labels "
          f"{shares}")


def pathfinder_report(resolution: int, count: int, level: str,
                      seed: int) -> str:
  start = time.perf_counter()
  source = lra.Pathfinder(count, seed=seed, resolution=resolution,
                          level=level)
  images, labels, dots = source.images(range(count))
  seconds = time.perf_counter() - start
  agree = sum(lra.ink_connected(image, a, b, source.config.gap) == bool(l)
              for image, l, (a, b) in zip(images, labels, dots))
  return (f"Pathfinder-{resolution} {level}, {count} images, {seconds:.1f}"
          f" s: label 1 {100 * labels.mean():.1f} %, ink "
          f"{100 * (images > 0).mean():.1f} %, flood fill agrees with "
          f"{agree} of {count} labels")


def main(argv):
  del argv
  if FLAGS.listops:
    print(listops_report(FLAGS.listops, FLAGS.seed), flush=True)
  for resolution, count in ((32, FLAGS.pathfinder32),
                            (64, FLAGS.pathfinder64)):
    if count:
      print(pathfinder_report(resolution, count, FLAGS.level, FLAGS.seed),
            flush=True)


if __name__ == "__main__":
  app.run(main)
