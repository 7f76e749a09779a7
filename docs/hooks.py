"""MkDocs hooks: the measured results and the source notes join the site.

The pages under ``docs/`` link the repository's own files by their paths in
the repository (``../benchmarks/RESULTS.md``), so that the links work when
the Markdown is read in place. ``on_files`` adds those files to the site
under the same paths (``benchmarks/RESULTS.md``), and
``on_page_markdown`` drops the ``../`` that leaves ``docs/``, so that
``mkdocs build --strict`` checks every such link against a real file.
"""

from __future__ import annotations

import pathlib
import re

from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Repository files served beside the pages, as globs from the root.
EXTRA = ("benchmarks/**/*.md", "benchmarks/**/*.png",
         "pallas_kernels/README.md", "lin_attn_jax/ops/*/README.md")


def on_files(files, config):
  """Adds the ``EXTRA`` files under their paths in the repository."""
  for pattern in EXTRA:
    for path in sorted(ROOT.glob(pattern)):
      files.append(File(path.relative_to(ROOT).as_posix(), str(ROOT),
                        config["site_dir"], config["use_directory_urls"]))
  return files


def on_page_markdown(markdown, page, config, files):
  """Rewrites links out of ``docs/`` into links inside the site."""
  src = page.file.abs_src_path or ""
  docs = pathlib.Path(config["docs_dir"]).resolve()
  if not pathlib.Path(src).resolve().is_relative_to(docs):
    return markdown
  depth = page.file.src_uri.count("/")
  up = re.escape("../" * (depth + 1))
  return re.sub(r"\]\(" + up, "](" + "../" * depth, markdown)
