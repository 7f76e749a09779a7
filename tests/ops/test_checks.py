"""``ops.common.checks.positive_int``: the one check of a positive int."""

import pathlib
import re

import numpy as np
import pytest

import lin_attn_jax
from lin_attn_jax.ops.common import checks


@pytest.mark.parametrize("value", [1, 3, np.int32(7)])
def test_positive_int_returns_its_value(value):
  assert checks.positive_int("n", value) == value


def test_positive_int_allows_none_when_asked():
  assert checks.positive_int("n", None, allow_none=True) is None
  with pytest.raises(ValueError, match=r"^n must be a positive int, got None"):
    checks.positive_int("n", None)


@pytest.mark.parametrize("value", [0, -2, 2.0, True, "3", np.float32(2)])
def test_positive_int_names_the_argument(value):
  with pytest.raises(ValueError,
                     match=rf"^width must be a positive int or None or "
                           rf"'auto', got {re.escape(repr(value))}$"):
    checks.positive_int("width", value, allow_none=True, also=" or 'auto'")


def test_check_chunk_size_only_checks_chunk_sizes():
  root = pathlib.Path(lin_attn_jax.__file__).parent
  calls = re.compile(r"check_chunk_size\(\s*(\w+)(?:\s*,\s*\"(\w+)\")?")
  misused = []
  for path in root.rglob("*.py"):
    for value, name in calls.findall(path.read_text()):
      if (name or value) not in ("chunk_size", "sub_chunk_size"):
        misused.append(f"{path.relative_to(root)}: {value} as {name}")
  assert misused == []
