"""The import graph points one way (docs/design.md):

    experiments -> lin_attn_jax.train / lin_attn_jax.convert
      -> lin_attn_jax.models -> lin_attn_jax.layers -> lin_attn_jax.ops
      -> pallas_kernels

Every ``import`` statement of every module (at any depth: imports inside
functions count) of ``lin_attn_jax``, ``pallas_kernels``, ``experiments``
and ``tests`` is read from its syntax tree, so the checks see imports that
a run would not reach. ``lin_attn_jax.testing`` (the form-checking harness)
sits beside the library: it may import the ops, layers and models, and
nothing in the library imports it. Only the tests of the experiments
(``tests/experiments/``) import ``experiments``.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("lin_attn_jax", "pallas_kernels", "experiments", "tests")

_LIBRARY_ABOVE_OPS = tuple(
    f"lin_attn_jax.{name}" for name in ("layers", "models", "train",
                                        "convert", "data", "sharding",
                                        "testing", "analysis"))
# Module prefix -> the prefixes its imports must not start with. A module
# gets the rules of every prefix it starts with.
FORBIDDEN = {
    "lin_attn_jax": ("tests", "experiments"),
    "experiments": ("tests",),
    "pallas_kernels": ("lin_attn_jax", "experiments", "tests", "flax"),
    # The functional ops depend on JAX alone.
    "lin_attn_jax.ops": _LIBRARY_ABOVE_OPS + ("flax",),
    "lin_attn_jax.feature_maps": _LIBRARY_ABOVE_OPS + ("flax",),
    "lin_attn_jax.layers": ("lin_attn_jax.models", "lin_attn_jax.train",
                            "lin_attn_jax.convert", "lin_attn_jax.data",
                            "lin_attn_jax.testing"),
    "lin_attn_jax.models": ("lin_attn_jax.train", "lin_attn_jax.convert",
                            "lin_attn_jax.testing"),
    "lin_attn_jax.sharding": ("lin_attn_jax.layers", "lin_attn_jax.models",
                              "lin_attn_jax.train", "lin_attn_jax.convert",
                              "lin_attn_jax.testing"),
    "lin_attn_jax.data": ("lin_attn_jax.layers", "lin_attn_jax.models",
                          "lin_attn_jax.train", "lin_attn_jax.convert",
                          "lin_attn_jax.testing"),
    "lin_attn_jax.train": ("lin_attn_jax.testing",),
    "lin_attn_jax.convert": ("lin_attn_jax.testing",),
    "lin_attn_jax.testing": ("lin_attn_jax.train", "lin_attn_jax.convert"),
    "lin_attn_jax.analysis": ("lin_attn_jax.train", "lin_attn_jax.convert",
                              "lin_attn_jax.testing"),
}
# Tests import experiments only from tests/experiments/.
TESTS_OF_EXPERIMENTS = "tests.experiments"


def _starts_with(name: str, prefix: str) -> bool:
  return name == prefix or name.startswith(prefix + ".")


def imported_names(module: str, source: str) -> list[tuple[int, str]]:
  """``(line, dotted name)`` of everything ``source`` imports: ``import a.b``
  gives ``a.b``; ``from a import b`` gives ``a`` and ``a.b`` (``b`` may be a
  submodule); relative imports are resolved against ``module``."""
  names = []
  package = module.split(".")
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names += [(node.lineno, alias.name) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parent = package[:len(package) - node.level]
        base = ".".join(parent + ([base] if base else []))
      names.append((node.lineno, base))
      names += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                if alias.name != "*"]
  return names


def violations(module: str, source: str) -> list[str]:
  """The imports of ``module`` (from ``source``) that break the rules."""
  rules = [f for prefix, forbidden in FORBIDDEN.items()
           if _starts_with(module, prefix) for f in forbidden]
  if (_starts_with(module, "tests")
      and not _starts_with(module, TESTS_OF_EXPERIMENTS)):
    rules.append("experiments")
  found = {}
  for line, name in imported_names(module, source):
    for forbidden in rules:
      if _starts_with(name, forbidden):
        found.setdefault((line, forbidden), f"{module}:{line} imports {name}")
  return sorted(found.values())


def _modules(package):
  for path in sorted((ROOT / package).rglob("*.py")):
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    yield ".".join(parts), path


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package):
  """Lists every forbidden import of the package's modules."""
  found = []
  for module, path in _modules(package):
    found += violations(module, path.read_text())
  assert not found, "imports against the layering:\n" + "\n".join(found)


def sys_path_edits(source: str) -> list[int]:
  """Lines of ``source`` that change ``sys.path`` (a call of one of its
  methods, or an assignment to it): scripts run as modules instead."""
  lines = []
  for node in ast.walk(ast.parse(source)):
    target = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      target = node.func.value
    elif isinstance(node, (ast.Assign, ast.AugAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      target = next((t for t in targets if isinstance(t, ast.Attribute)),
                    None)
    if (isinstance(target, ast.Attribute) and target.attr == "path"
        and isinstance(target.value, ast.Name) and target.value.id == "sys"):
      lines.append(node.lineno)
  return lines


@pytest.mark.parametrize("package", PACKAGES)
def test_no_sys_path_edits(package):
  found = [f"{module}:{line}" for module, path in _modules(package)
           for line in sys_path_edits(path.read_text())]
  assert not found, "sys.path edited at " + ", ".join(found)


@pytest.mark.parametrize("source, expected", [
    ("import sys\nsys.path.insert(0, 'x')", [2]),
    ("import sys\nsys.path.append('x')", [2]),
    ("import sys\nsys.path = ['x']", [2]),
    ("import sys\nsys.path += ['x']", [2]),
    ("import sys\nprint(sys.path)", []),
    ("import os\nos.path.join('a', 'b')", []),
])
def test_sys_path_edits_are_found(source, expected):
  assert sys_path_edits(source) == expected


def test_every_package_has_modules():
  for package in PACKAGES:
    assert len(list(_modules(package))) > 1, package


@pytest.mark.parametrize("module, source, expected", [
    ("lin_attn_jax.ops.gla.chunk", "from flax import nnx",
     ["lin_attn_jax.ops.gla.chunk:1 imports flax"]),
    ("lin_attn_jax.ops.gla.chunk", "def f():\n  import lin_attn_jax.layers",
     ["lin_attn_jax.ops.gla.chunk:2 imports lin_attn_jax.layers"]),
    ("lin_attn_jax.ops.gla.chunk", "from lin_attn_jax import models",
     ["lin_attn_jax.ops.gla.chunk:1 imports lin_attn_jax.models"]),
    ("lin_attn_jax.ops.gla.chunk", "from ...layers import rwkv",
     ["lin_attn_jax.ops.gla.chunk:1 imports lin_attn_jax.layers"]),
    ("lin_attn_jax.layers.gla", "from lin_attn_jax.models import lm",
     ["lin_attn_jax.layers.gla:1 imports lin_attn_jax.models"]),
    ("lin_attn_jax.models.lm", "from lin_attn_jax import testing",
     ["lin_attn_jax.models.lm:1 imports lin_attn_jax.testing"]),
    ("lin_attn_jax.train.loop", "import tests.conftest",
     ["lin_attn_jax.train.loop:1 imports tests.conftest"]),
    ("experiments.train", "from tests import helpers",
     ["experiments.train:1 imports tests"]),
    ("tests.models.test_models", "from experiments import configs",
     ["tests.models.test_models:1 imports experiments"]),
    ("pallas_kernels.gated_linear.tpu", "import lin_attn_jax.ops",
     ["pallas_kernels.gated_linear.tpu:1 imports lin_attn_jax.ops"]),
    ("tests.experiments.test_train", "from experiments import configs", []),
    ("lin_attn_jax.ops.gla.chunk", "from lin_attn_jax import ops", []),
    ("lin_attn_jax.layers.gla", "from lin_attn_jax import ops, sharding", []),
    ("lin_attn_jax.testing.harness",
     "from lin_attn_jax.models.lm import LM", []),
])
def test_violations_are_found(module, source, expected):
  assert violations(module, source) == sorted(expected)
