"""Training runs side by side in worker processes, one core each.

``multiprocessing.Pool`` waits forever for the result of a worker that
died (killed for memory, or crashed inside XLA); ``ProcessPoolExecutor``
raises ``BrokenProcessPool`` instead, so a grid stops with an error rather
than hanging.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from typing import Callable, Iterable, Iterator


def pin_next_core(counter) -> None:
  """Pins each worker process to its own core, in turn (on Linux)."""
  with counter.get_lock():
    index = counter.value
    counter.value += 1
  if hasattr(os, "sched_setaffinity"):
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[index % len(cores)]})


def unordered_results(fn: Callable, args: Iterable[tuple],
                      workers: int) -> Iterator:
  """``fn(*a)`` for every ``a`` of ``args`` in ``workers`` spawned
  processes (each pinned to a core), yielded as they finish.

  Raises:
    RuntimeError: a worker process died; the runs it had not finished are
      lost (those already yielded are kept by the caller).
  """
  context = multiprocessing.get_context("spawn")
  counter = context.Value("i", 0)
  with concurrent.futures.ProcessPoolExecutor(
      workers, mp_context=context, initializer=pin_next_core,
      initargs=(counter,)) as pool:
    futures = [pool.submit(fn, *a) for a in args]
    try:
      for future in concurrent.futures.as_completed(futures):
        yield future.result()
    except concurrent.futures.process.BrokenProcessPool as error:
      raise RuntimeError(
          "a worker process died (killed for memory, or a crash in the "
          "compiler); rerun the command to redo the runs without a result, "
          "or run with one worker to see the failure") from error
