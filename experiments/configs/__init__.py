"""Presets for ``python -m experiments.train --config=NAME``.

- ``tiny``: the CPU default of ``make run``, a small GLA + sliding-window
  hybrid that learns the standard library's source in a few minutes on two
  cores;
- ``small``: one TPU host (v4-8, v5e-8, v6e-8) or one GPU node: a 12-layer,
  768-wide hybrid in bfloat16;
- ``pod``: a multi-host TPU pod slice: a 24-layer, 2048-wide hybrid with
  FSDP, rematerialised blocks and bfloat16.
"""

from __future__ import annotations

import importlib

from experiments.configs.base import Experiment

PRESETS = ("tiny", "small", "pod")


def get(name: str) -> Experiment:
  """The ``CONFIG`` of preset ``name``."""
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
  return importlib.import_module(f"experiments.configs.{name}").CONFIG


__all__ = ["Experiment", "PRESETS", "get"]
