"""Op specs of every core, collected for the verifier and the benchmark."""

import importlib

# One module per core; each defines SPECS: list[OpSpec].
_MODULES = (
    "experiments.specs.gated_linear",
    "experiments.specs.diagonal_ssm",
    "experiments.specs.delta_rule",
    "experiments.specs.softmax",
)


def all_specs():
  specs = []
  for name in _MODULES:
    specs.extend(importlib.import_module(name).SPECS)
  return {spec.name: spec for spec in specs}
