"""What the experiment grids (MQAR, LRA) share: a results file of one JSON
line per run that a rerun resumes from, the runs side by side in worker
processes, and the cost line of a report."""

from __future__ import annotations

import json
import os
import resource
from typing import Callable, Iterable, Sequence

from experiments import process_pool


def cpu_seconds() -> float:
  """CPU seconds (user and system) of this process so far."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def children_cpu_seconds() -> float:
  """CPU seconds of this process's finished worker processes."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def read_results(path: str) -> list[dict]:
  """The records of a results file (none when it does not exist yet)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def append_results(path: str, records: Iterable[dict]) -> None:
  """Appends ``records`` to ``path``, a line each, as soon as a run ends
  (a killed grid keeps what finished)."""
  with open(path, "a") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")


def run_jobs(fn: Callable, args: Sequence[tuple], workers: int,
             save: Callable) -> None:
  """``save(fn(*a))`` for every ``a`` of ``args``: here, one after the
  other, with ``workers <= 1``; otherwise in ``workers`` processes
  (``process_pool``), saved as they finish."""
  if workers <= 1:
    for a in args:
      save(fn(*a))
  else:
    for result in process_pool.unordered_results(fn, args, workers):
      save(result)


def cost_line(records: Sequence[dict], what: str = "compiling included"
              ) -> str:
  """``N runs, C CPU seconds and W s of wall time in all`` over
  ``records`` (their ``cpu_s`` and ``wall_s``)."""
  cpu = sum(r["cpu_s"] for r in records)
  wall = sum(r["wall_s"] for r in records)
  return (f"{len(records)} runs, {cpu:,.0f} CPU seconds and {wall:,.0f} s "
          f"of wall time in all (sums over runs, {what}).")
