"""Context parallelism: per-device memory and bytes sent, from compiled HLO.

For each op, the forward + backward of its chunk form (``sum(o) +
sum(final_state)``, gradients of every input) is compiled for one device
(``P = 1``, no mesh) and for a mesh whose ``"sequence"`` axis has ``P``
devices (``jax.set_mesh``; the op splits the sequence by itself). Nothing
runs: the figures come from the compiled programs,

- temp memory per device: ``compiled.memory_analysis().temp_size_in_bytes``
  (arguments and outputs not included), and its ratio to ``P = 1``;
- bytes each device sends per layer and step: every collective of the
  compiled HLO (forward and backward), counted for a ring over the ``P``
  devices (all-gather ``(P - 1) x`` its operand, reduce-scatter ``(P - 1) /
  P x`` its operand, all-reduce ``2 (P - 1) / P x``, collective-permute once
  its operand), next to the formula of ``docs/context_parallel.md``. The
  CPU back end emits these collectives synchronously (no ``-start`` /
  ``-done`` pairs), which is what is parsed.

  python -m experiments.bench_context_parallel --ops=gla,gated_delta_rule \
      --length=65536 --parts=8 --out=benchmarks/RESULTS_context_parallel.md
"""

from __future__ import annotations

import re
import sys

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType

from experiments.bench_utils import cpu_devices, write_section
from lin_attn_jax import ops

_DEVICES = 8
FLAGS = flags.FLAGS
flags.DEFINE_list("ops", ["gla", "gated_delta_rule"], "Ops to compile.")
flags.DEFINE_integer("length", 65536, "Sequence length T.")
flags.DEFINE_list("parts", ["8"], "Devices P on the sequence axis (> 1).")
flags.DEFINE_integer("batch", 1, "B.")
flags.DEFINE_integer("heads", 4, "H.")
flags.DEFINE_integer("dim_k", 64, "K.")
flags.DEFINE_integer("dim_v", 64, "V.")
flags.DEFINE_integer("chunk_size", 64, "Chunk size of the chunk forms.")
flags.DEFINE_string("out", "", "Markdown file to write the table into.")

_F32 = jnp.float32
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1,
          "s8": 1, "u8": 1, "f64": 8, "s64": 8}
_COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce",
                "collective-permute", "all-to-all")


def _problem(name):
  """``(function, argument shapes, summary bytes per device formula)``."""
  b, t, h = FLAGS.batch, FLAGS.length, FLAGS.heads
  dk, dv = FLAGS.dim_k, FLAGS.dim_v
  shape = jax.ShapeDtypeStruct
  qk = shape((b, t, h, dk), _F32)
  v = shape((b, t, h, dv), _F32)
  if name == "gla":
    def fn(q, k, v, g):
      return ops.chunk_gla(q, k, v, g, output_final_state=True,
                           chunk_size=FLAGS.chunk_size)
    # R_p [B, H, K, V] and the decay [B, H, K].
    return fn, (qk, qk, v, qk), b * h * (dk * dv + dk) * 4
  if name == "gated_delta_rule":
    def fn(q, k, v, g, beta):
      return ops.chunk_gated_delta_rule(q, k, v, g, beta,
                                        output_final_state=True,
                                        use_qk_l2norm=True,
                                        chunk_size=FLAGS.chunk_size)
    gate = shape((b, t, h), _F32)
    # R_p [B, H, K, V] and the transition M_p [B, H, K, K].
    return fn, (qk, qk, v, gate, gate), b * h * dk * (dv + dk) * 4
  raise ValueError(f"unknown op {name!r}; this benchmark knows gla and "
                   "gated_delta_rule")


def _compiled(fn, args, parts):
  def loss(*xs):
    o, state = fn(*xs)
    return jnp.sum(o) + jnp.sum(state)

  grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
  if parts == 1:
    return grad.lower(*args).compile()
  mesh = jax.make_mesh((parts,), ("sequence",), axis_types=(AxisType.Auto,),
                       devices=jax.devices()[:parts])
  with jax.set_mesh(mesh):
    return grad.lower(*args).compile()


def _shape_bytes(text):
  """Bytes of every ``dtype[dims]`` array shape in ``text``."""
  total = 0
  for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text):
    if dtype in _BYTES:
      total += _BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",")
                                            if d] or [1]))
  return total


def collectives(hlo: str, parts: int):
  """``{kind: (count, bytes sent per device)}`` of the collectives in
  ``hlo`` (a compiled module's text), for rings of ``parts`` devices.

  Sizes come from each instruction's result: an all-gather's operand is
  ``1 / P`` of it, a reduce-scatter's ``P`` times it.
  """
  found = {}
  pattern = re.compile(r"=\s*(.*?)\s(" + "|".join(_COLLECTIVES) + r")\(")
  for line in hlo.splitlines():
    match = pattern.search(line)
    if match is None:
      continue
    result, kind = _shape_bytes(match.group(1)), match.group(2)
    sent = {"all-gather": (parts - 1) / parts * result,
            "reduce-scatter": (parts - 1) * result,
            "all-reduce": 2 * (parts - 1) / parts * result,
            "collective-permute": result,
            "all-to-all": (parts - 1) / parts * result}[kind]
    count, total = found.get(kind, (0, 0))
    found[kind] = (count + 1, total + sent)
  return found


def main(argv):
  del argv
  cpu_devices(_DEVICES)
  command = "python -m experiments.bench_context_parallel " + " ".join(
      sys.argv[1:])
  dims = (f"B={FLAGS.batch}, T={FLAGS.length}, H={FLAGS.heads}, "
          f"K={FLAGS.dim_k}, V={FLAGS.dim_v}, float32, "
          f"chunk_size={FLAGS.chunk_size}")
  lines = [f"Command: `{command}`", "",
           f"{dims}; forward + backward compiled for "
           f"{jax.devices()[0].device_kind} devices (nothing runs).", "",
           "| op | P | temp MiB per device | vs P = 1 | collectives (count) | "
           "bytes sent per device, measured | formula "
           "`2 (P - 1) x summary` |",
           "|---|---|---|---|---|---|---|"]
  print("\n".join(lines), flush=True)
  for name in FLAGS.ops:
    fn, args, summary = _problem(name)
    base = _compiled(fn, args, 1).memory_analysis().temp_size_in_bytes
    row = f"| {name} | 1 | {base / 2 ** 20:.1f} | 1 | - | 0 | 0 |"
    lines.append(row)
    print(row, flush=True)
    for parts in map(int, FLAGS.parts):
      compiled = _compiled(fn, args, parts)
      temp = compiled.memory_analysis().temp_size_in_bytes
      found = collectives(compiled.as_text(), parts)
      kinds = ", ".join(f"{k} ({n})" for k, (n, _) in sorted(found.items()))
      sent = sum(s for _, s in found.values())
      row = (f"| {name} | {parts} | {temp / 2 ** 20:.1f} | "
             f"{temp / base:.3f} | {kinds} | {sent:,.0f} | "
             f"{2 * (parts - 1) * summary:,} |")
      lines.append(row)
      print(row, flush=True)
  if FLAGS.out:
    key = (f"bench_context_parallel ops={','.join(FLAGS.ops)} "
           f"T={FLAGS.length} B={FLAGS.batch} H={FLAGS.heads} "
           f"K={FLAGS.dim_k} V={FLAGS.dim_v}")
    write_section(FLAGS.out, key, lines)


if __name__ == "__main__":
  app.run(main)
