"""The ```python blocks of README.md and docs/**/*.md run.

Each file's blocks run in order in one namespace, as a reader would paste
them; a block that raises fails its file's test. Blocks fenced as ```sh,
```bash or ```text are not run.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
  """``(line, source)`` of every ```python block of ``text``, in order."""
  return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
          for m in _BLOCK.finditer(text)]


def run_blocks(path: pathlib.Path, text: str) -> None:
  """Runs the ```python blocks of ``text`` in one namespace; a block's
  errors point at ``path`` and its lines in the file."""
  namespace = {"__name__": f"docs_{path.stem}"}
  for line, source in python_blocks(text):
    code = compile("\n" * (line - 1) + source, str(path), "exec")
    exec(code, namespace)  # noqa: S102


def markdown_files() -> list[pathlib.Path]:
  return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


_WITH_CODE = [p for p in markdown_files()
              if python_blocks(p.read_text(encoding="utf-8"))]


def test_the_readme_and_the_site_have_code_to_run():
  names = {p.relative_to(ROOT).as_posix() for p in _WITH_CODE}
  assert {"README.md", "docs/ops.md", "docs/layers.md"} <= names


@pytest.mark.parametrize("path", _WITH_CODE,
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_code_blocks_run(path, tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  run_blocks(path, path.read_text(encoding="utf-8"))


def test_a_raising_block_fails_with_its_file_and_line(tmp_path):
  text = ("# page\n\n```python\nx = 1\n```\n\n```sh\nnot python\n```\n\n"
          "```python\nassert x == 2, 'x is 1'\n```\n")
  path = tmp_path / "page.md"
  with pytest.raises(AssertionError, match="x is 1") as info:
    run_blocks(path, text)
  frame = info.traceback[-1]
  assert str(frame.path) == str(path) and frame.lineno + 1 == 12


def test_only_python_fences_run():
  text = "```bash\nexit 1\n```\n```text\nraise SystemExit\n```\n"
  assert python_blocks(text) == []
  run_blocks(pathlib.Path("page.md"), text)
