"""Times the parallel, chunk and recurrent forms side by side.

For each op and length: forward and forward+backward wall time (minimum
over ``--repeats`` rounds; each round gives every form of that op and
length, forward and forward+backward, one untimed and one timed run, so the
forms are timed side by side) and the compiled temp memory from
``jax.jit(f).lower(...).compile().memory_analysis()`` (exact, repeatable).
Writes a markdown table to stdout and, with ``--out``, into a section of
that file (replacing an earlier section for the same ops and shapes).

``--options`` gives an op's forms keyword arguments other than the
registry's (which are sized for tests), e.g. MoBA's blocks of 256; forms in
``--untimed_forms`` are compiled, never run (the dense ``[T, T]`` forms at
lengths where running them would take minutes and gigabytes).

  python -m experiments.bench_forms --ops=gla --lengths=1024,2048,4096,8192 \
      --out=benchmarks/RESULTS.md
  python -m experiments.bench_forms --ops=moba --forms=naive,chunk \
      --untimed_forms=naive --lengths=2048,4096,8192 \
      --options=moba:block_size=256,top_k=4
"""

from __future__ import annotations

import ast
import os
import sys

from absl import app, flags
import jax

from experiments.bench_utils import (compile_form, interleaved_min_times,
                                     write_section)
from lin_attn_jax.ops.registry import Dims, all_specs

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's absl flags, defined when it runs (importing the module
  defines none, so that tests can import ``parse_options``)."""
  flags.DEFINE_list("ops", ["gla"], "Ops to time.")
  flags.DEFINE_list("forms", ["parallel", "chunk", "recurrent"],
                    "Forms to time.")
  flags.DEFINE_list("lengths",
                    ["1024", "2048", "4096", "8192", "16384", "32768"],
                    "Sequence lengths T.")
  flags.DEFINE_integer("batch", 1, "B.")
  flags.DEFINE_integer("heads", 4, "H.")
  flags.DEFINE_integer("dim_k", 64, "K.")
  flags.DEFINE_integer("dim_v", 64, "V.")
  flags.DEFINE_integer("chunk_size", 64, "Chunk size of the chunk forms.")
  flags.DEFINE_integer("max_parallel_length", 8192, "Longest T for the "
                       "parallel form (its memory is O(T^2)).")
  flags.DEFINE_integer("repeats", 5,
                       "Timed rounds (every form once per round).")
  flags.DEFINE_string("out", "", "Markdown file to write the table into.")
  flags.DEFINE_bool("memory_only", False, "Compile only: the temp memory "
                    "columns, no timed runs (the time columns read '-').")
  flags.DEFINE_list("untimed_forms", [], "Forms compiled for their temp "
                    "memory but never run (their time columns read '-').")
  flags.DEFINE_multi_string(
      "options", [], "Keyword arguments of one op's forms, "
      "'op:name=value,name=value' (values are Python literals, else strings), "
      "replacing the registry's; a chunk_size here replaces --chunk_size for "
      "that op (None: the chunk form's own default). Repeat for more ops.")


def _mib(n):
  return f"{n / 2 ** 20:.1f}"


def parse_options(entries):
  """``{op: {name: value}}`` from ``--options`` entries ``"op:name=value,
  ..."``; a value is a Python literal (``256``, ``None``) or else the string
  itself."""
  options = {}
  for entry in entries:
    op, colon, pairs = entry.partition(":")
    if not colon or not op.strip():
      raise ValueError(f"--options entry {entry!r} is not "
                       "'op:name=value,name=value'")
    for pair in pairs.split(","):
      name, equals, value = (x.strip() for x in pair.partition("="))
      if not equals or not name:
        raise ValueError(f"--options entry {entry!r}: {pair!r} is not "
                         "name=value")
      try:
        value = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        pass
      options.setdefault(op.strip(), {})[name] = value
  return options


def main(argv):
  del argv
  specs = all_specs()
  options = parse_options(FLAGS.options)
  unknown = sorted(set(options) - set(FLAGS.ops))
  if unknown:
    raise ValueError(f"--options names ops not in --ops: {unknown}")
  command = "python -m experiments.bench_forms " + " ".join(sys.argv[1:])
  lines = [f"Command: `{command}`", "",
           f"Device: {jax.devices()[0].device_kind}, {os.cpu_count()} cores; "
           f"B={FLAGS.batch}, H={FLAGS.heads}, K={FLAGS.dim_k}, "
           f"V={FLAGS.dim_v}, float32, chunk_size={FLAGS.chunk_size}.", "",
           *(f"Options of {op}: " + ", ".join(f"{k}={v}" for k, v in
                                            kwargs.items()) + "."
             for op, kwargs in options.items()),
           *([""] if options else []),
           "| op | T | form | fwd ms | fwd+bwd ms | fwd temp MiB | "
           "fwd+bwd temp MiB | fwd+bwd time / chunk | fwd+bwd temp / chunk |",
           "|---|---|---|---|---|---|---|---|---|"]
  print("\n".join(lines), flush=True)
  for name in FLAGS.ops:
    spec = specs[name]
    op_options = dict(options.get(name, {}))
    chunk_size = op_options.pop("chunk_size", FLAGS.chunk_size)
    for length in map(int, FLAGS.lengths):
      dims = Dims(FLAGS.batch, length, FLAGS.heads, FLAGS.dim_k, FLAGS.dim_v)
      inputs = spec.make_inputs(jax.random.PRNGKey(0), dims, False)
      inputs["segment_ids"] = None
      compiled = {}
      for form in FLAGS.forms:
        if form == "parallel" and length > FLAGS.max_parallel_length:
          continue
        compiled[form] = compile_form(spec, form, inputs, chunk_size,
                                      op_options)
      times = {} if FLAGS.memory_only else interleaved_min_times(
          {(form, kind): run for form, runs in compiled.items()
           if form not in FLAGS.untimed_forms
           for kind, run in enumerate(runs[:2])}, FLAGS.repeats)
      results = {form: (times.get((form, 0)), times.get((form, 1)), mem_f,
                        mem_b)
                 for form, (_, _, mem_f, mem_b) in compiled.items()}
      base = results.get("chunk")
      for form, (tf, tb, mf, mb) in results.items():
        rel_t = f"{tb / base[1]:.2f}x" if base and tb is not None else "-"
        rel_m = f"{mb / max(base[3], 1):.2f}x" if base else "-"
        tf, tb = (("-" if x is None else f"{x * 1e3:.1f}") for x in (tf, tb))
        row = (f"| {name} | {length} | {form} | {tf} | {tb} | {_mib(mf)} | "
               f"{_mib(mb)} | {rel_t} | {rel_m} |")
        lines.append(row)
        print(row, flush=True)
  if FLAGS.out:
    _write_section(FLAGS.out, lines)


def _write_section(path, lines):
  key = (f"bench_forms ops={','.join(FLAGS.ops)} B={FLAGS.batch} "
         f"H={FLAGS.heads} K={FLAGS.dim_k} V={FLAGS.dim_v}")
  write_section(path, key, lines)


if __name__ == "__main__":
  define_flags()
  app.run(main)
