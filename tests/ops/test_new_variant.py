"""docs/new_variant.md, followed end to end.

The guide's titled code blocks are written, as they are, into a temporary
package ``my_ops`` (loaded from its folder by file location), so the toy
op, its spec and its check are the guide's own; ``check_fixed_decay.py``
registers the op and checks every form, context parallelism included, and
``broken_form.py`` breaks a form and expects the check to fail. Every block
of the guide has a title (none is left to a runner of untitled blocks,
which would lack ``my_ops``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pathlib
import re
import sys

import pytest

from lin_attn_jax import testing
from lin_attn_jax.ops import registry

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "new_variant.md"
BLOCK = re.compile(r'^```python(?: title="([^"]+)")?\n(.*?)^```$',
                   re.MULTILINE | re.DOTALL)


def guide_blocks() -> tuple[dict[str, str], list[str]]:
  """``({title: code}, [untitled code, ...])`` of the guide's Python blocks."""
  titled, untitled = {}, []
  for title, code in BLOCK.findall(GUIDE.read_text()):
    if title:
      titled[title] = code
    else:
      untitled.append(code)
  return titled, untitled


@pytest.fixture
def my_ops(tmp_path, monkeypatch):
  """The guide's package, written under ``tmp_path`` and imported as
  ``my_ops`` (removed from ``sys.modules`` and the registry afterwards)."""
  titled, _ = guide_blocks()
  (tmp_path / "my_ops").mkdir()
  (tmp_path / "my_ops" / "__init__.py").write_text("")
  for title, code in titled.items():
    path = tmp_path / title
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
  for name in [m for m in sys.modules if m.split(".")[0] == "my_ops"]:
    monkeypatch.delitem(sys.modules, name)
  folder = tmp_path / "my_ops"
  spec = importlib.util.spec_from_file_location(
      "my_ops", folder / "__init__.py", submodule_search_locations=[str(folder)])
  package = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, "my_ops", package)
  spec.loader.exec_module(package)
  importlib.import_module("my_ops.spec")
  yield tmp_path
  for name in [m for m in sys.modules if m.split(".")[0] == "my_ops"]:
    del sys.modules[name]
  if "fixed_decay" in registry.all_specs():
    registry.unregister("fixed_decay")


def test_guide_has_every_file():
  titled, untitled = guide_blocks()
  forms = {f"my_ops/fixed_decay/{n}.py"
           for n in ("naive", "parallel", "chunk", "recurrent", "step")}
  assert forms <= set(titled)
  assert {"my_ops/spec.py", "check_fixed_decay.py",
          "broken_form.py"} <= set(titled)
  assert not untitled


def test_guide_registers_and_checks_the_op(my_ops):
  titled, _ = guide_blocks()
  namespace = {}
  exec(compile(titled["check_fixed_decay.py"],  # noqa: S102
               str(my_ops / "check_fixed_decay.py"), "exec"), namespace)
  spec = registry.get_spec("fixed_decay")
  assert spec is sys.modules["my_ops.spec"].SPEC
  errors = namespace["errors"]
  assert set(errors) == {"parallel", "chunk", "recurrent", "step",
                         "chunk@sequence=2", "chunk@sequence=4"}
  for form, form_errors in errors.items():
    assert set(form_errors) == {"o", "state", "dq", "dk", "dv", "dw",
                                "dinitial_state"}, form
    assert max(form_errors.values()) <= 1e-5, (form, form_errors)


def test_guide_broken_form_fails(my_ops):
  titled, _ = guide_blocks()
  namespace = {"SPEC": None}
  spec_code = titled["check_fixed_decay.py"].split("registry.register")[0]
  exec(compile(spec_code, str(my_ops / "imports.py"), "exec"),  # noqa: S102
       namespace)
  exec(compile(titled["broken_form.py"], str(my_ops / "broken_form.py"),
               "exec"), namespace)  # noqa: S102
  assert namespace["broken"].forms["chunk"] is namespace["ignores_documents"]


def test_wrong_decay_fails_on_every_quantity(my_ops):
  """A chunk form with twice the decay: the error names the form and the
  output, the state and the gradients are all over tolerance."""
  spec = sys.modules["my_ops.spec"].SPEC
  chunk = sys.modules["my_ops.fixed_decay"].chunk_fixed_decay

  def doubled(w, **inputs):
    return chunk(w=2.0 * w, **inputs)

  broken = dataclasses.replace(spec, forms={**spec.forms, "chunk": doubled})
  dims = registry.Dims(length=20, dim_k=4, dim_v=6)
  with pytest.raises(testing.FormMismatch, match="fixed_decay/chunk") as info:
    testing.check_forms(broken, dims=dims, forms=("chunk", "recurrent"))
  assert set(info.value.failures) == {"chunk"}
  assert {"o", "state", "dw"} <= set(info.value.failures["chunk"])
  errors = testing.check_forms(broken, dims=dims, forms=("chunk",),
                               raise_on_failure=False)
  assert errors["chunk"]["o"] > 1e-3


def test_register_refuses_a_taken_name_and_a_spec_without_naive(my_ops):
  spec = sys.modules["my_ops.spec"].SPEC
  with pytest.raises(ValueError, match="already registered"):
    registry.register(dataclasses.replace(spec, name="gla"))
  no_naive = {n: f for n, f in spec.forms.items() if n != "naive"}
  with pytest.raises(ValueError, match="no 'naive' form"):
    registry.register(dataclasses.replace(spec, forms=no_naive))
  with pytest.raises(KeyError, match="no op 'fixed_decay'"):
    registry.get_spec("fixed_decay")
