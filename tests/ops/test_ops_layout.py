"""Every op folder has one shape (docs/design.md).

``lin_attn_jax/ops/<op>/`` holds each form in a file named for it
(``naive.py``, ``parallel.py``, ``chunk.py``, ``recurrent.py``, ``step.py``),
beside ``inputs.py``, ``context_parallel.py``, a README and helper modules
named for what they contain; its ``__init__.py`` only imports and exports.
"""

import ast
import importlib
import pathlib
import re
import shutil

import lin_attn_jax.ops as ops

OPS_DIR = pathlib.Path(ops.__file__).parent
FORMS = ("naive", "parallel", "chunk", "recurrent", "step")
SHARED = ("common",)
# Packages that only re-export other op folders' forms under a model's name
# (H3 is the shift SSM and S4D).
ALIASES = ("h3",)
ALLOWED = ("__init__", "inputs", "context_parallel")
# A helper module may not be named after a form (or "forms"): its name would
# say that it holds a form.
FORM_WORD = re.compile(r"(^|_)(naive|parallel|chunk|recurrent|step|forms)($|_)")


def form_of(name):
  """The form a public name is named for, or None."""
  if name.startswith("naive_recurrent_") or name.endswith("_reference"):
    return "naive"
  for form in ("parallel", "chunk", "recurrent"):
    if name.startswith(form + "_"):
      return form
  if name.endswith("_step"):
    return "step"
  return None


def op_folders(root):
  return sorted(p for p in root.iterdir()
                if (p / "__init__.py").is_file() and p.name not in SHARED)


def init_problems(init):
  """What in an ``__init__.py`` is neither its docstring, an import nor
  ``__all__``."""
  tree = ast.parse(init.read_text())
  problems = []
  for i, node in enumerate(tree.body):
    if i == 0 and isinstance(node, ast.Expr) and isinstance(
        node.value, ast.Constant) and isinstance(node.value.value, str):
      continue
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      continue
    if isinstance(node, ast.Assign) and [
        getattr(t, "id", None) for t in node.targets] == ["__all__"]:
      continue
    problems.append(f"{init}:{node.lineno}: {type(node).__name__} in "
                    "__init__.py (it only imports and exports)")
  return problems


def defined_names(path):
  """Top-level names a module defines (functions, classes, assignments)."""
  names = set()
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.Assign):
      names.update(t.id for t in node.targets if isinstance(t, ast.Name))
  return names


def folder_problems(folder):
  """The shape of one op folder: its ``__init__``, its module names, and a
  form defined in each form file."""
  problems = init_problems(folder / "__init__.py")
  for module in sorted(folder.glob("*.py")):
    stem = module.stem
    if stem in FORMS:
      public = [n for n in defined_names(module) if not n.startswith("_")]
      # naive.py may hold an op's reference under the op's own name.
      if not any(form_of(n) == stem or (stem == "naive" and not form_of(n))
                 for n in public):
        problems.append(f"{module}: a form file that defines no {stem} form")
    elif stem in ALLOWED:
      continue
    elif FORM_WORD.search(stem) or stem == folder.name:
      problems.append(f"{module}: a helper named after a form or its folder")
  if not any((folder / f"{form}.py").is_file() for form in FORMS):
    problems.append(f"{folder}: no form file")
  return problems


def alias_problems(folder):
  problems = init_problems(folder / "__init__.py")
  modules = sorted(p.name for p in folder.glob("*.py"))
  if modules != ["__init__.py"]:
    problems.append(f"{folder}: an alias package holds modules {modules}")
  return problems


def layout_problems(root):
  problems = init_problems(root / "__init__.py")
  for folder in op_folders(root):
    if folder.name in ALIASES:
      problems += alias_problems(folder)
    else:
      problems += folder_problems(folder)
  return problems


def test_every_op_folder_has_the_shape():
  assert op_folders(OPS_DIR), "no op folders found"
  assert layout_problems(OPS_DIR) == []


def _exported_forms(module):
  names = getattr(module, "__all__", None) or dir(module)
  for name in names:
    value = getattr(module, name)
    if callable(value) and not name.startswith("_") and form_of(name):
      yield name, value


def test_every_exported_form_is_defined_in_its_form_file():
  forms = dict(_exported_forms(ops))
  assert len(forms) > 50
  wrong = {}
  for name, fn in forms.items():
    parts = fn.__module__.split(".")
    if (len(parts) != 4 or parts[:2] != ["lin_attn_jax", "ops"]
        or parts[2] in SHARED or parts[3] != form_of(name)):
      wrong[name] = fn.__module__
  assert wrong == {}


def test_op_packages_export_their_forms_from_form_files():
  wrong = {}
  for folder in op_folders(OPS_DIR):
    package = importlib.import_module(f"lin_attn_jax.ops.{folder.name}")
    for name, fn in _exported_forms(package):
      if fn.__module__.rsplit(".", 1)[-1] != form_of(name):
        wrong[f"{folder.name}.{name}"] = fn.__module__
  assert wrong == {}


def test_the_layout_check_finds_a_broken_folder(tmp_path):
  root = tmp_path / "ops"
  shutil.copytree(OPS_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
  assert layout_problems(root) == []
  (root / "gla" / "__init__.py").write_text(
      '"""GLA."""\n\ndef chunk_gla():\n  return 1\n')
  (root / "hgrn" / "forms.py").write_text("x = 1\n")
  (root / "kda" / "chunk.py").write_text('"""Nothing."""\n')
  (root / "rg_lru" / "rg_lru.py").write_text("y = 2\n")
  (root / "h3" / "s4d.py").write_text("z = 3\n")
  problems = "\n".join(layout_problems(root))
  assert "gla/__init__.py:3: FunctionDef" in problems
  assert "hgrn/forms.py: a helper named after a form" in problems
  assert "kda/chunk.py: a form file that defines no chunk form" in problems
  assert "rg_lru/rg_lru.py: a helper named after a form or its folder" in (
      problems)
  assert "h3: an alias package holds modules" in problems
