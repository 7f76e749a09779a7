"""Compile checks of the Pallas kernels for TPU and GPU, without the hardware.

Every kernel of ``pallas_kernels`` (the gated-linear family: ``none``,
``scalar`` and ``channel`` gates, Based's Taylor features; the delta rule
of DeltaNet, Gated DeltaNet and KDA: its sweep kernels, and on GPU in
bfloat16 its chunk-parallel kernels, which the op runs there; forgetting
attention's blockwise kernels) is compiled, forward and backward, in
float32 and bfloat16, at the kernel tests' shapes and at the per-head
shapes of the layers' papers, for TPU v4, v5e, v5p, v6e, tpu7x (libtpu) and
GPU sm_80, sm_90 (jax-cuda12-plugin). Each case's program holds the forward
kernel and the backward kernels (``jax.value_and_grad`` of a loss over the
outputs and the final state, with an initial state and segment ids, so
every optional input and output is there; forgetting attention has no
state, and a case may add grouped heads and a window); it is traced once per
toolchain and dtype (per GPU target: settings may differ by compute
capability), and each distinct ``pallas_call`` in it is compiled on
its own (the XLA around the kernels is not what is checked), once per
target: a kernel equal to one already compiled for the target (same body,
grid, blocks, operands and settings: the delta-rule kernels do not depend
on the gate kind, so DeltaNet's and KDA's at equal widths are one) is
reported as such, not compiled again. A case
fails on a compile error (VMEM or shared-memory overflow included) or, on
GPU, on a register spill. ``compile_targets.py`` reads the resources.

Run (each toolchain in its own environment; ``make compile-check`` builds
them, runs both and writes the report):
  .venv-tpu/bin/python -m experiments.compile_kernels --toolchain=tpu \
      --out=build/compile/tpu.json
  .venv-cuda/bin/python -m experiments.compile_kernels --toolchain=cuda \
      --out=build/compile/cuda.json
  python -m experiments.compile_kernels --report=build/compile/tpu.json,\
build/compile/cuda.json --out=benchmarks/RESULTS_compile.md
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time

from absl import app
from absl import flags

from experiments import compile_targets

FLAGS = flags.FLAGS
flags.DEFINE_enum("toolchain", None, list(compile_targets.TOOLCHAINS),
                  "Compile for this toolchain's targets.")
flags.DEFINE_list("targets", [], "Targets (default: all of the toolchain).")
flags.DEFINE_list("cases", [], "Case names to run (default: all).")
flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Input dtypes.")
flags.DEFINE_list("report", [], "JSON results to merge into the report.")
flags.DEFINE_string("out", None, "Output: JSON results, or with --report "
                    "the markdown report.")
flags.DEFINE_list("compare", [], "Two TPU JSON results (before, after): "
                  "print a markdown table of each case's largest spill per "
                  "pass in both.")


@dataclasses.dataclass(frozen=True)
class Case:
  """One kernel configuration: the per-head shape a layer gives it."""
  name: str         # unique: family, op and shape
  family: str       # "gated_linear" or "delta_rule"
  gate: str         # "none", "scalar" or "channel"
  dim_k: int        # K per head, as the kernel sees it
  dim_v: int        # V per head, as the kernel sees it
  chunk: int = 64   # the layer's chunk_size
  layers: str = ""  # which layers and d_model give this shape
  heads: int = 2    # H of the compiled program (the grid; speed only)
  length: int = 512  # T of the compiled program
  kv_heads: int | None = None  # forgetting_attn: key and value heads (None:
                               # heads)
  window: int | None = None    # forgetting_attn: window_size
  batch: int = 1    # B of the compiled program


# Per-head widths (K, V) at d_model 2048 with each paper's head count, and
# at d_model 4096 with the same head count (twice the widths: the larger
# per-program state; a model that doubles its heads instead keeps the
# d_model 2048 widths). Based's kernel sees the Taylor features (1 + F +
# F^2 for F = 16) and the values plus a normalizer column.
CASES = [
    Case("gla_test", "gated_linear", "channel", 16, 24, layers="kernel tests"),
    Case("simple_gla_test", "gated_linear", "scalar", 16, 24,
         layers="kernel tests"),
    Case("linear_attn_test", "gated_linear", "none", 16, 24,
         layers="kernel tests"),
    Case("gla_2048", "gated_linear", "channel", 256, 512,
         layers="GLA D=2048 H=4 (GLA 1.3B)"),
    Case("gla_4096", "gated_linear", "channel", 512, 1024,
         layers="GLA D=4096 H=4"),
    Case("gla_4096_chunk256", "gated_linear", "channel", 512, 1024,
         chunk=256, layers="GLA D=4096 H=4, chunk_size 256 (TPU: 256-token "
         "chunks in bfloat16, 128 in float32; GPU: 64)"),
    Case("retnet_2048", "gated_linear", "scalar", 256, 512,
         layers="RetNet D=2048 H=8 (RetNet 1.3B)"),
    Case("retnet_4096", "gated_linear", "scalar", 512, 1024,
         layers="RetNet D=4096 H=8"),
    Case("based_2048", "gated_linear", "none", 273, 129,
         layers="Based D=2048 H=16 F=16 (Based 1.3B)"),
    Case("based_4096", "gated_linear", "none", 273, 257,
         layers="Based D=4096 H=16 F=16"),
    Case("delta_rule_test", "delta_rule", "none", 8, 12, chunk=16,
         layers="kernel tests"),
    Case("kda_test", "delta_rule", "channel", 8, 130, chunk=16,
         layers="kernel tests"),
    Case("deltanet_2048", "delta_rule", "none", 128, 128,
         layers="DeltaNet D=2048 H=16 (DeltaNet 1.3B)"),
    Case("deltanet_4096", "delta_rule", "none", 256, 256,
         layers="DeltaNet D=4096 H=16"),
    Case("gated_deltanet_2048", "delta_rule", "scalar", 256, 512,
         layers="GatedDeltaNet D=2048 H=6 (Gated DeltaNet 1.3B)"),
    Case("gated_deltanet_4096", "delta_rule", "scalar", 512, 1024,
         layers="GatedDeltaNet D=4096 H=6"),
    Case("kda_2048", "delta_rule", "channel", 128, 128,
         layers="KDA D=2048 H=16 (Kimi Linear's 128-wide heads)"),
    Case("kda_4096", "delta_rule", "channel", 256, 256,
         layers="KDA D=4096 H=16"),
    Case("fox_test", "forgetting_attn", "scalar", 16, 24, heads=4,
         kv_heads=2, window=100, layers="kernel tests (grouped heads, "
         "window)"),
    Case("fox_2048", "forgetting_attn", "scalar", 64, 64, length=4096,
         layers="FoX D=2048 H=32 (fla's forgetting_transformer), T=4096"),
    Case("fox_4096", "forgetting_attn", "scalar", 128, 128, length=4096,
         layers="FoX D=4096 H=32, T=4096"),
    Case("fox_4096_gqa_window", "forgetting_attn", "scalar", 128, 128,
         heads=4, kv_heads=1, window=1024, length=4096,
         layers="FoX D=4096 H=32, 8 KV heads, window 1024, T=4096"),
]
CASES_BY_NAME = {case.name: case for case in CASES}


def program(case: Case, dtype: str, backend: str, block_sizes=None):
  """``(fn, args)``: forward and backward of ``case``'s kernel as one
  program, ``args`` as ``jax.ShapeDtypeStruct``s."""
  import jax
  import jax.numpy as jnp
  dt = jnp.dtype(dtype)
  f32 = jnp.float32
  b, t, h, dk, dv = case.batch, case.length, case.heads, case.dim_k, case.dim_v
  if case.family == "gated_linear":
    from pallas_kernels.gated_linear import chunk_gated_linear_attention
    g_shape = {"none": None, "scalar": (b, t, h),
               "channel": (b, t, h, dk)}[case.gate]
    args = [jax.ShapeDtypeStruct((b, t, h, dk), dt),
            jax.ShapeDtypeStruct((b, t, h, dk), dt),
            jax.ShapeDtypeStruct((b, t, h, dv), dt),
            jax.ShapeDtypeStruct((b, h, dk, dv), f32),
            jax.ShapeDtypeStruct((b, t), jnp.int32)]
    if g_shape is not None:
      args.append(jax.ShapeDtypeStruct(g_shape, f32))

    def loss(q, k, v, s0, ids, g=None):
      o, s = chunk_gated_linear_attention(
          q, k, v, g, initial_state=s0, segment_ids=ids,
          output_final_state=True, backend=backend, chunk_size=case.chunk,
          block_sizes=block_sizes)
      return jnp.sum(o.astype(f32)) + jnp.sum(s)

    argnums = (0, 1, 2, 3) + ((5,) if g_shape is not None else ())
  elif case.family == "forgetting_attn":
    from pallas_kernels.forgetting_attn import forgetting_attention
    hkv = case.kv_heads or h
    args = [jax.ShapeDtypeStruct((b, t, h, dk), dt),
            jax.ShapeDtypeStruct((b, t, hkv, dk), dt),
            jax.ShapeDtypeStruct((b, t, hkv, dv), dt),
            jax.ShapeDtypeStruct((b, t, h), f32),
            jax.ShapeDtypeStruct((b, t), jnp.int32)]

    def loss(q, k, v, c, ids):
      o = forgetting_attention(q, k, v, c, segment_ids=ids,
                               window_size=case.window, backend=backend,
                               block_sizes=block_sizes)
      return jnp.sum(o.astype(f32))

    argnums = (0, 1, 2, 3)
  elif backend == "tpu" or dtype == "bfloat16":
    # TPU, and bfloat16 on CUDA: the chunk-parallel kernels (what the op
    # runs).
    from pallas_kernels.delta_rule import (chunk_delta_rule_gpu,
                                           chunk_delta_rule_tpu)
    chunk_delta_rule = (chunk_delta_rule_tpu if backend == "tpu"
                        else chunk_delta_rule_gpu)
    g_shape = {"none": None, "scalar": (b, t, h),
               "channel": (b, t, h, dk)}[case.gate]
    args = [jax.ShapeDtypeStruct((b, t, h, dk), dt),
            jax.ShapeDtypeStruct((b, t, h, dk), dt),
            jax.ShapeDtypeStruct((b, t, h, dv), dt),
            jax.ShapeDtypeStruct((b, t, h), f32),
            jax.ShapeDtypeStruct((b, h, dk, dv), f32),
            jax.ShapeDtypeStruct((b, t), jnp.int32)]
    if g_shape is not None:
      args.append(jax.ShapeDtypeStruct(g_shape, f32))

    def loss(q, k, v, beta, s0, ids, g=None):
      o, s = chunk_delta_rule(
          q, k, v, beta, g, initial_state=s0, segment_ids=ids,
          output_final_state=True, chunk_size=case.chunk)
      return jnp.sum(o.astype(f32)) + jnp.sum(s)

    argnums = (0, 1, 2, 3, 4) + ((6,) if g_shape is not None else ())
  else:
    from pallas_kernels.delta_rule import ChunkTerms, chunk_delta_rule_sweep
    n, c = -(-t // case.chunk), case.chunk
    g = dk if case.gate == "channel" else 1
    shapes = ChunkTerms(w=(b, n, h, c, dk), u=(b, n, h, c, dv),
                        q=(b, n, h, c, dk), scores=(b, n, h, c, c),
                        k=(b, n, h, c, dk), decay=(b, n, h, g))
    args = [ChunkTerms(*(jax.ShapeDtypeStruct(s, f32) for s in shapes)),
            jax.ShapeDtypeStruct((b, h, dk, dv), f32)]

    def loss(terms, s0):
      o, s = chunk_delta_rule_sweep(
          terms, initial_state=s0, output_final_state=True,
          bf16_dots=dtype == "bfloat16", backend=backend,
          block_sizes=block_sizes)
      return jnp.sum(o.astype(f32)) + jnp.sum(s)

    argnums = (0, 1)
  return jax.value_and_grad(loss, argnums=argnums), args


def _inner_jaxprs(eqn):
  """The jaxprs in an equation's parameters (calls, custom derivatives,
  loop bodies, branches), in order."""
  from jax.extend import core
  for value in eqn.params.values():
    for sub in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(sub, core.ClosedJaxpr):
        yield sub.jaxpr
      elif isinstance(sub, core.Jaxpr):
        yield sub


def _pallas_eqns(jaxpr):
  """The ``pallas_call`` equations of ``jaxpr`` and of the jaxprs inside
  its equations (calls, custom derivatives), in order."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      yield eqn
      continue
    for sub in _inner_jaxprs(eqn):
      yield from _pallas_eqns(sub)


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One ``pallas_call`` of a case's program, ready to compile alone."""
  name: str    # the pallas_call's name
  key: str     # equal for equal kernels: body, grid, blocks, operands
  eqn: object  # the jaxpr equation


def _tracing_for(target: str | None):
  """The context to trace a program in for ``target``: a GPU target's
  compute capability (the settings that differ by GPU generation,
  ``pallas_kernels.common.dispatch.cuda_capability``)."""
  import contextlib

  from pallas_kernels.common import dispatch
  if target not in compile_targets.GPU_TARGETS:
    return contextlib.nullcontext()
  arch = compile_targets.GPU_TARGETS[target][1]                # sm_90a
  digits = arch[3:5]
  return dispatch.assume_cuda_capability((int(digits[0]), int(digits[1])))


def kernels(case: Case, dtype: str, backend: str, block_sizes=None,
            target: str | None = None):
  """The distinct Pallas kernels of ``case``'s forward and backward program
  (``program``), traced for ``target`` (a GPU's generation; None: for
  every target of ``backend``, as a call without a GPU traces them)."""
  import jax
  fn, args = program(case, dtype, backend, block_sizes)
  found = {}
  with _tracing_for(target):
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  for eqn in _pallas_eqns(jaxpr):
    params = eqn.params
    key = repr((params["name"], str(params["jaxpr"]),
                params["grid_mapping"], params["compiler_params"],
                [v.aval for v in eqn.invars], params["out_avals"],
                params["input_output_aliases"]))
    found.setdefault(key, Kernel(params["name"], key, eqn))
  return list(found.values())


def compile_kernel(kernel: Kernel, target: str, dump_dir: str):
  """Compiles the kernel alone (its ``pallas_call`` on abstract operands)
  for ``target``: its ``KernelResources`` (raises what the compiler
  raises)."""
  import jax
  eqn = kernel.eqn
  args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
          for v in eqn.invars]

  def call(*operands):
    return eqn.primitive.bind(*operands, **eqn.params)

  # The dumps are named (and filtered) after the function.
  call.__name__ = call.__qualname__ = kernel.name

  found = compile_targets.compile_kernels(call, args, target, dump_dir)
  if len(found) != 1:
    raise RuntimeError(f"expected the resources of {kernel.name} alone, got "
                       f"{[k.kernel for k in found]}")
  return dataclasses.replace(found[0], kernel=kernel.name)


def _check_kernel(kernel: Kernel, target: str, dump_dir: str) -> dict:
  backend = "tpu" if target in compile_targets.TPU_TARGETS else "gpu"
  start = time.perf_counter()
  try:
    res = compile_kernel(kernel, target, dump_dir)
  except Exception as e:  # noqa: BLE001 -- any compiler error fails the case
    first = str(e).strip().splitlines()
    out = {"kernel": kernel.name, "ok": False,
           "error": first[0][:300] if first else repr(e)}
  else:
    spills = backend == "gpu" and bool(res.spill_bytes or res.spill_loads)
    out = {**dataclasses.asdict(res), "ok": not spills,
           "error": "register spills" if spills else None}
  out["seconds"] = round(time.perf_counter() - start, 1)
  return out


def check(case: Case, dtype: str, target: str, dump_dir: str,
          block_sizes=None, *, traced=None, compiled=None) -> dict:
  """Compiles every distinct kernel of one case for ``target``; a dict with
  the kernels' resources, compile times and ``ok`` / ``error``.
  ``traced``: ``kernels(...)`` of the case if already traced; ``compiled``:
  a dict ``key -> kernel result`` of this target shared between cases (a
  kernel equal to one already compiled is not compiled again)."""
  backend = "tpu" if target in compile_targets.TPU_TARGETS else "gpu"
  if traced is None:
    traced = kernels(case, dtype, backend, block_sizes, target)
  compiled = {} if compiled is None else compiled
  rows = []
  for kernel in traced:
    if kernel.key in compiled:
      rows.append({**compiled[kernel.key], "seconds": 0.0,
                   "same_as": compiled[kernel.key]["compiled_in"]})
      continue
    row = _check_kernel(kernel, target, dump_dir)
    row["compiled_in"] = case.name
    compiled[kernel.key] = row
    rows.append(row)
  failed = [r for r in rows if not r["ok"]]
  return {"case": case.name, "dtype": dtype, "target": target,
          "ok": not failed, "kernels": rows,
          "error": "; ".join(f"{r['kernel']}: {r['error']}"
                             for r in failed) or None,
          "seconds": round(sum(r["seconds"] for r in rows), 1)}


def run_checks(toolchain, targets, cases, dtypes, out):
  dump_dir = tempfile.mkdtemp(prefix="compile_kernels_")
  for key, value in compile_targets.environment(toolchain, dump_dir).items():
    os.environ[key] = value
  backend = "tpu" if toolchain == "tpu" else "gpu"
  results = []
  compiled = {target: {} for target in targets}
  for case in cases:
    for dtype in dtypes:
      # TPU: traced once for every generation; GPU: once per target
      # (settings may differ by compute capability).
      traced = kernels(case, dtype, backend) if backend == "tpu" else None
      for target in targets:
        result = check(case, dtype, target, dump_dir, traced=traced,
                       compiled=compiled[target])
        results.append(result)
        print(f"{target:6s} {case.name:22s} {dtype:9s} "
              f"{'ok  ' if result['ok'] else 'FAIL'} {result['seconds']:6.1f}s"
              + (f"  {result['error']}" if result["error"] else ""),
              flush=True)
        if out:
          os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
          with open(out, "w") as f:
            json.dump(results, f, indent=1)
  return results


def _when(kernel):
  if "same_as" in kernel:
    return f"= {kernel['same_as']}"
  return f"{kernel['seconds']}"


def _mib(n):
  return "-" if n is None else f"{n / 2**20:.2f}"


def _kb(n):
  return "-" if n is None else f"{n / 1024:.1f}"


# The ops of benchmarks/RESULTS_kernels.md, at its shape, for the grids
# section: (label, family, gate).
GRID_OPS = [("simple_gla", "gated_linear", "scalar"),
            ("gla", "gated_linear", "channel"),
            ("gated_delta_rule", "delta_rule", "scalar"),
            ("kda", "delta_rule", "channel"),
            ("forgetting_attn", "forgetting_attn", "scalar")]


def _body_products(jaxpr):
  """The ``[m, k] x [k, n]`` operand shapes of the matmuls in a kernel
  body (and the loops and branches inside it), each once."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      shapes = tuple(tuple(v.aval.shape) for v in eqn.invars)
      if shapes not in found:
        found.append(shapes)
    for sub in _inner_jaxprs(eqn):
      found += [x for x in _body_products(sub) if x not in found]
  return found


def body_flops(jaxpr) -> int:
  """Matmul flops of one program of a kernel, counted from its body: ``2 m
  n k`` per ``dot_general`` (masked products at full size), times the trip
  count of each loop around it; a branch (``pl.when``) counts its largest
  side. ``ValueError`` for a loop whose trip count is not static (the
  forgetting-attention GPU kernels walk only the blocks their queries
  see)."""
  import math

  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
          lhs[d] for d in contract)
      continue
    if name == "while":
      raise ValueError("a while loop in a kernel body: no static trip count")
    inner = [body_flops(sub) for sub in _inner_jaxprs(eqn)]
    if name == "scan":
      total += eqn.params["length"] * sum(inner)
    elif name == "cond":
      total += max(inner, default=0)
    else:
      total += sum(inner)
  return total


def gated_linear_flops(t: int, heads: int, batch: int, dim_k: int,
                       dim_v: int, chunk: int) -> int:
  """The chunk algorithm's matmul flops of one forward and backward pass
  (the states recomputed in the backward pass, the scores once per pass;
  ``pallas_kernels/README.md``): per head and chunk ``2C (2KV + CK + CV)``
  forward and ``2C (5KV + 3CK + 2CV)`` backward."""
  c, k, v = chunk, dim_k, dim_v
  per_chunk = 2 * c * (7 * k * v + 4 * c * k + 3 * c * v)
  return batch * heads * (-(-t // c)) * per_chunk


def delta_rule_flops(t: int, heads: int, batch: int, dim_k: int,
                     dim_v: int, chunk: int) -> int:
  """The delta rule's chunk algorithm (``pallas_kernels/README.md``): per
  head and chunk, forward the keys' scores ``2 C^2 K``, a triangular
  inverse ``C^3 / 3`` multiply-adds, ``W`` and ``U'`` ``2 C^2 (K + V)``,
  the sweep ``4 C K V`` and the outputs on ``U`` ``2C (CK + CV + KV)``;
  backward, the WY terms and the sweep again, ``dU``'s part from its own
  chunk ``2 C^2 (K + V)``, the reverse sweep ``6 C K V``, ``dq``, ``dk``
  and ``dW`` ``2C (CV + 3CK + 3KV)``, and the WY terms' gradient (the
  scores and the inverse again, ``dT``, ``dX``, ``dY`` ``4 C^2 (K + V)``,
  ``dA = -T^T dT T^T`` ``4 C^3``, ``dA_k`` to both sides ``4 C^2 K``)."""
  c, k, v = chunk, dim_k, dim_v
  inverse = 2 * c ** 3 // 3
  wy = 2 * c * c * k + inverse + 2 * c * c * (k + v)
  forward = wy + 4 * c * k * v + 2 * c * (c * k + c * v + k * v)
  backward = (wy + 4 * c * k * v + 2 * c * c * (k + v) + 6 * c * k * v
              + 2 * c * (c * v + 3 * c * k + 3 * k * v)
              + 2 * c * c * k + inverse + 4 * c * c * (k + v)
              + 4 * c ** 3 + 4 * c * c * k)
  return batch * heads * (-(-t // c)) * (forward + backward)


def kernel_grids(backend: str, batch=8, heads=16, length=8192, width=128,
                 ops=None):
  """``[(op, kernel, grid, programs, products, flops, cost_flops,
  repeat)]``: every Pallas call of the forward and backward program of
  each of ``GRID_OPS`` (or those named in ``ops``) on ``backend`` at that
  shape in bfloat16, read from the traced program: the grid of each
  ``pallas_call``, the matmul operand shapes of its body, the matmul flops
  counted from its body times its grid (``body_flops``), its
  ``cost_estimate``'s flops, and whether an identical call came before
  (the states sweep runs in both passes). GPU programs are traced as for
  an H100 or H200 (sm_90: the settings that differ by generation)."""
  import contextlib

  from pallas_kernels.common import dispatch
  hopper = (dispatch.assume_cuda_capability((9, 0)) if backend == "gpu"
            else contextlib.nullcontext())
  with hopper:
    return _kernel_grids(backend, batch, heads, length, width, ops)


def _kernel_grids(backend, batch, heads, length, width, ops):
  import math

  import jax
  rows = []
  for op, family, gate in GRID_OPS:
    if ops is not None and op not in ops:
      continue
    case = Case(op, family, gate, width, width, batch=batch, heads=heads,
                length=length)
    fn, args = program(case, "bfloat16", backend)
    seen = set()
    for eqn in _pallas_eqns(jax.make_jaxpr(fn)(*args).jaxpr):
      grid = tuple(eqn.params["grid_mapping"].grid)
      name = eqn.params["name"]
      semantics = getattr(eqn.params["compiler_params"],
                          "dimension_semantics", None)
      # Programs that run at once: the parallel axes (TPU marks the
      # sequential ones "arbitrary"; a Triton grid is all parallel).
      parallel = [n for n, kind in zip(grid, semantics or ["parallel"] *
                                       len(grid)) if kind == "parallel"]
      products = _body_products(eqn.params["jaxpr"])
      key = (name, grid, str(products))
      cost = eqn.params.get("cost_estimate")
      try:
        flops = body_flops(eqn.params["jaxpr"]) * math.prod(grid)
      except ValueError:
        flops = None
      rows.append((op, name, grid, math.prod(parallel), products, flops,
                   None if cost is None else cost.flops, key in seen))
      seen.add(key)
  return rows


def kernel_chunk(backend: str, gate: str, width=128, length=8192) -> int:
  """The chunk the gated-linear kernels take by default in bfloat16."""
  from pallas_kernels.gated_linear import BlockSizes, gpu, tpu_chunks
  blocks = BlockSizes.default(backend, per_channel=gate == "channel",
                              chunk_size=64)
  if backend == "tpu":
    return tpu_chunks.make_layout(1, length, 1, width, width, blocks).chunk
  return gpu.make_layout(1, length, 1, width, width, blocks, bf16=True).chunk


def _grids_section():
  """The kernels' grids and matmul tiles at the benchmark's shape."""
  lines = ["## Grids and matmul tiles at B=8, H=16, T=8192, K=V=128, "
           "bfloat16", "",
           "Every Pallas kernel of each op's forward and backward program at "
           "the shape of `benchmarks/RESULTS_kernels.md` (132 SMs on an "
           "H100 or H200), read from the traced program: the grid of each "
           "`pallas_call`, its programs (the grid points that run in "
           "parallel: on TPU the axes marked parallel, the others walked in "
           "order inside each), and the operand shapes of the matmuls in "
           "its body. The delta-rule ops' TPU program is "
           "the sweep kernel (its chunk-local terms are XLA there).", ""]
  totals = ["Matmul flops of each op's forward and backward program, "
            "counted from the kernel bodies (`body_flops`: `2 m n k` per "
            "product, masked ones at full size, times the loops' trip "
            "counts and the grid; a `pl.when` counts its larger side, an "
            "upper bound where it skips blocks, as FoX's TPU kernels do "
            "above the diagonal; FoX's GPU kernels bound their loops by "
            "the blocks each query sees, which no static count gives), "
            "against the kernels' `cost_estimate`s (the GPU ones count a "
            "per-channel decay's pairs inside a row block as multiply-adds "
            "too) "
            "and, for the gated-linear ops, the chunk algorithm's count at "
            "the kernels' chunk (`gated_linear_flops`: per head and chunk "
            "`2C (2KV + CK + CV)` forward, `2C (5KV + 3CK + 2CV)` "
            "backward).", "",
            "| backend | op | chunk | counted GFLOP | cost_estimate GFLOP | "
            "chunk algorithm GFLOP | counted / algorithm |",
            "|---|---|---|---|---|---|---|"]
  gates = {op: gate for op, family, gate in GRID_OPS
           if family == "gated_linear"}
  for backend, title in (("gpu", "GPU (Triton)"), ("tpu", "TPU (Mosaic)")):
    lines += [f"{title}:", "", "| op | kernel | grid | programs | "
              "matmul operands in the body | GFLOP (body x grid) |",
              "|---|---|---|---|---|---|"]
    rows = kernel_grids(backend)
    for op, name, grid, programs, products, flops, _, repeat in rows:
      if repeat:
        continue
      tiles = ", ".join(f"{list(a)} x {list(b)}" for a, b in products)
      counted = "-" if flops is None else f"{flops / 1e9:.1f}"
      lines.append(f"| {op} | {name} | {grid} | {programs} | "
                   f"{tiles or '-'} | {counted} |")
    lines.append("")
    for op, *_ in GRID_OPS:
      flops = [r[5] for r in rows if r[0] == op]
      if None in flops:
        continue
      counted = sum(flops)
      cost = sum(r[6] or 0 for r in rows if r[0] == op)
      cells = ["-", "-", "-"]
      if op in gates:
        chunk = kernel_chunk(backend, gates[op])
        algorithm = gated_linear_flops(8192, 16, 8, 128, 128, chunk)
        cells = [str(chunk), f"{algorithm / 1e9:.1f}",
                 f"{counted / algorithm:.2f}"]
      totals.append(f"| {backend} | {op} | {cells[0]} | {counted / 1e9:.1f} "
                    f"| {cost / 1e9:.1f} | {cells[1]} | {cells[2]} |")
  return lines + totals + [""]


def report(paths, out):
  """Merges JSON results into the markdown report."""
  results = []
  for path in paths:
    with open(path) as f:
      results += json.load(f)
  failed = [r for r in results if not r["ok"]]
  done = {(r["target"], r["case"], r["dtype"]) for r in results}
  compiled = sum(1 for r in results for k in r["kernels"]
                 if "same_as" not in k)
  seconds = sum(k["seconds"] for r in results for k in r["kernels"])
  missing = [(t, c.name, d) for toolchain in compile_targets.TOOLCHAINS
             for t in compile_targets.TOOLCHAINS[toolchain] for c in CASES
             for d in ("float32", "bfloat16") if (t, c.name, d) not in done]
  lines = [
      "# Compile checks and resources of the Pallas kernels",
      "",
      "Deviceless compilation (no TPU or GPU was used): libtpu for TPU "
      "topologies, jax-cuda12-plugin with target configs for GPUs "
      "(`experiments/gpu_targets/`). Nothing ran: these are the compilers' "
      "figures, not measurements of speed. Regenerate with "
      "`make compile-check`.",
      "",
      f"{len(results)} cases x dtypes x targets checked, {len(failed)} "
      f"failed; {compiled} distinct kernels compiled in {seconds:.0f} s "
      "(both toolchains' compile times summed)"
      + (f"; {len(missing)} of the full set not compiled in this run "
         f"(listed at the end)." if missing else "."),
      "",
      "Columns: TPU `VMEM` is the scoped VMEM of the kernel (MiB), `spill` "
      "the vector registers spilled to VMEM (KiB), `MXU` the vmatmul "
      "instructions; GPU `regs` registers per thread, `spill` ptxas spill "
      "stores (KiB), `smem` shared memory per block (KiB), `mma` tensor-core "
      "instructions in the PTX (`mma` and `wgmma`), `wgmma` those of Hopper's "
      "warpgroup kind (sm_90 only); `compile s` the seconds its compilation took, "
      "or the case whose identical kernel (same body, blocks, grid and "
      "operands) was compiled for the target. Each case's kernels are the "
      "distinct Pallas kernels of its forward and backward program (the "
      "gradient of a loss over the outputs and the final state, with an "
      "initial state and segment ids), each compiled on its own.",
      "",
  ]
  if failed:
    lines += ["## Failures", "", "| target | case | dtype | error |",
              "|---|---|---|---|"]
    lines += [f"| {r['target']} | {r['case']} | {r['dtype']} | "
              f"{r['error']} |" for r in failed]
    lines.append("")
  lines += ["## Cases", "", "| case | family | gate | K | V | chunk | shape of |",
            "|---|---|---|---|---|---|---|"]
  for case in CASES:
    # Forgetting attention has no chunks; its blocks are BlockSizes'.
    chunk = "-" if case.family == "forgetting_attn" else case.chunk
    lines.append(f"| {case.name} | {case.family} | {case.gate} | {case.dim_k} "
                 f"| {case.dim_v} | {chunk} | {case.layers} |")
  lines.append("")
  for toolchain, targets in compile_targets.TOOLCHAINS.items():
    rows = [r for r in results if r["target"] in targets]
    if not rows:
      continue
    lines += [f"## {'TPU' if toolchain == 'tpu' else 'GPU'}", ""]
    if toolchain == "tpu":
      lines += ["| target | case | dtype | kernel | VMEM | spill | MXU | "
                "compile s |", "|---|---|---|---|---|---|---|---|"]
    else:
      lines += ["| target | case | dtype | kernel | regs | spill | smem | "
                "threads | mma | wgmma | compile s |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
      if not r["kernels"]:
        lines.append(f"| {r['target']} | {r['case']} | {r['dtype']} | "
                     f"FAILED: {r['error']} |")
      for k in r["kernels"]:
        head = f"| {r['target']} | {r['case']} | {r['dtype']} | {k['kernel']} "
        if "matmuls" not in k:
          lines.append(head + f"| FAILED: {k['error']} |")
          continue
        if toolchain == "tpu":
          lines.append(head + f"| {_mib(k['vmem_bytes'])} | "
                       f"{_kb(k['spill_bytes'])} | {k['matmuls']} | "
                       f"{_when(k)} |")
        else:
          lines.append(head + f"| {k['registers']} | "
                       f"{_kb(k['spill_bytes'])} | {_kb(k['shared_bytes'])} | "
                       f"{k['threads']} | {k['matmuls']} | "
                       f"{k.get('wgmma', 0)} | {_when(k)} |")
    lines.append("")
  lines += _grids_section()
  if missing:
    lines += ["## Not compiled in this run", "",
              ", ".join(f"{t}/{c}/{d}" for t, c, d in missing), ""]
  with open(out, "w") as f:
    f.write("\n".join(lines))
  return failed + [{"missing": m} for m in missing]


# The kernels of each pass by name (less the family's prefix): the sweeps
# over sub-chunks and the delta rule's sweep kernels, then the chunk-parallel
# kernels (the states sweep and the delta rule's WY and sweep kernels run
# in both passes).
_PASSES = {"forward": {"forward", "tpu_states", "tpu_outputs", "tpu_wy",
                       "tpu_sweep"},
           "backward": {"dq", "dkv", "states", "backward", "tpu_states",
                        "tpu_state_grads", "tpu_grads", "tpu_wy",
                        "tpu_sweep", "tpu_dv", "tpu_sweep_grads",
                        "tpu_wy_grads"}}


def compare(before_path, after_path):
  """Markdown rows ``| case | dtype | target | forward | backward | ok |`` of
  two TPU results: per pass, the largest vector-register spill of its
  kernels before and after (KiB), and whether each pass's largest spill
  after is at most a quarter of before's."""
  def load(path):
    with open(path) as f:
      return {(r["case"], r["dtype"], r["target"]): r["kernels"]
              for r in json.load(f) if r["ok"]}

  def largest(kernels, direction):
    names = _PASSES[direction]
    unknown = {k["kernel"] for k in kernels
               if k["kernel"].split("_", 2)[-1] not in
               _PASSES["forward"] | _PASSES["backward"]}
    if unknown and not all(n.startswith("forgetting_attn") for n in unknown):
      raise ValueError(f"kernels of no known pass: {sorted(unknown)}")
    spills = [k["spill_bytes"] / 1024 for k in kernels
              if k["kernel"].split("_", 2)[-1] in names]
    return max(spills, default=0.0)

  before, after = load(before_path), load(after_path)
  lines = ["| case | dtype | target | forward: largest spill before -> after "
           "(KiB) | backward: before -> after (KiB) | after <= before / 4 |",
           "|---|---|---|---|---|---|"]
  for key in sorted(after):
    if key not in before:
      continue
    cells, ok = [], True
    for direction in ("forward", "backward"):
      old, new = largest(before[key], direction), largest(after[key],
                                                          direction)
      ok = ok and new <= old / 4
      cells.append(f"{old:.0f} -> {new:.0f}")
    lines.append(f"| {' | '.join(key)} | {' | '.join(cells)} | "
                 f"{'yes' if ok else 'no'} |")
  return "\n".join(lines)


def main(argv):
  del argv
  if FLAGS.compare:
    print(compare(*FLAGS.compare))
    return 0
  if FLAGS.report:
    failed = report(FLAGS.report, FLAGS.out)
    print(f"report: {FLAGS.out}; {len(failed)} failed")
    return 1 if failed else 0
  if FLAGS.toolchain is None:
    raise app.UsageError("give --toolchain or --report")
  targets = FLAGS.targets or compile_targets.TOOLCHAINS[FLAGS.toolchain]
  cases = ([CASES_BY_NAME[name] for name in FLAGS.cases] if FLAGS.cases
           else CASES)
  results = run_checks(FLAGS.toolchain, targets, cases, FLAGS.dtypes,
                       FLAGS.out)
  failed = [r for r in results if not r["ok"]]
  print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  app.run(main)
