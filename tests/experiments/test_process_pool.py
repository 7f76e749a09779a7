"""Runs in worker processes: results as they finish, and an error, not a
hang, when a worker dies."""

import math
import os

import pytest

from experiments import process_pool


def test_results_of_every_run():
  results = process_pool.unordered_results(math.sqrt, [(4.0,), (9.0,)], 2)
  assert sorted(results) == [2.0, 3.0]


def test_a_dead_worker_raises():
  with pytest.raises(RuntimeError, match="a worker process died"):
    list(process_pool.unordered_results(os._exit, [(3,)], 1))
