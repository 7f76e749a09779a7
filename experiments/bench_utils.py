"""Timing and results-file helpers shared by the benchmark scripts."""

from __future__ import annotations

import os
import re
import statistics
import time

import jax


def interleaved_min_times(fns, repeats: int):
  """Minimum wall time of each ``fn()`` of ``fns`` (a dict) over ``repeats``
  rounds. A round gives every function one turn: an untimed call, then a
  timed one. On a shared machine a slow spell then hits every function of a
  round alike, and the minimum is the least disturbed run; the untimed call
  first keeps a function from paying for the memory that the one before it
  released (fresh pages fault in on first touch)."""
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      jax.block_until_ready(fn())
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
  return {name: min(ts) for name, ts in times.items()}


def median_time(fn, args, repeats: int, warmup: int = 1) -> float:
  """Median wall time of ``fn(*args)`` over ``repeats`` runs, after
  ``warmup`` untimed runs (the first compiles)."""
  for _ in range(max(warmup, 1)):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def write_section(path: str, key: str, lines) -> None:
  """Puts ``lines`` between ``<!-- begin key -->`` and ``<!-- end key -->``
  in the markdown file ``path``, replacing an earlier section of that key."""
  begin, end = f"<!-- begin {key} -->", f"<!-- end {key} -->"
  section = "\n".join([begin, *lines, end])
  text = open(path).read() if os.path.exists(path) else "# Results\n"
  pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
  if pattern.search(text):
    text = pattern.sub(lambda _: section, text)
  else:
    text = text.rstrip("\n") + "\n\n" + section + "\n"
  with open(path, "w") as f:
    f.write(text)
