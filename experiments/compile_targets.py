"""Compiling for TPUs and GPUs without one: targets, dumps, resource figures.

Deviceless compilation runs the real back ends on a CPU-only machine: Mosaic
and LLO inside libtpu for TPU topologies, XLA's Triton pipeline and ptxas
(from ``nvidia-cuda-nvcc-cu12``) for CUDA target configs. The recipe, its
environment variables and what it reports are in
``../shared/notes/compile-without-hardware.md``; the toolchains live in their
own virtual environments (``make compile-check``).

One process serves one toolchain: ``environment(toolchain, dump_dir)`` gives
the variables to start it with (libtpu and XLA read their dump flags once, at
start-up), and ``compile_kernels(fn, args, target, dump_dir)`` compiles one
program and returns a ``KernelResources`` per Pallas kernel in it, read from
the dumps, which it then clears:

- TPU: the VMEM of each kernel (its scoped allocations: block windows and
  their double buffers, scratch, spill slots), the bytes of vector
  registers spilled to VMEM and the number of MXU matmul instructions
  (``vmatmul``), from the register-allocated LLO;
- GPU: registers per thread, spill stores and loads, stack frame (``ptxas
  -v`` on the kernel's PTX, as XLA runs it), shared memory, grid and
  threads (XLA's thunk sequence), and the tensor-core instructions in the
  PTX (``mma`` / ``wgmma``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (topology name, chip config name, chips per host)
TPU_TARGETS = {
    "v4": ("v4:2x2x1", "megacore", (2, 2, 1)),
    "v5e": ("v5e:2x2", "default", (2, 2, 1)),
    "v5p": ("v5:2x2x1", "megacore", (2, 2, 1)),
    "v6e": ("v6e:2x2", "default", (2, 2, 1)),
    "tpu7x": ("tpu7x:2x2x1", "default", (2, 2, 1)),
}
# name -> (target config file, ptxas architecture)
GPU_TARGETS = {
    "sm_80": ("a100_sxm.txtpb", "sm_80"),
    "sm_90": ("h100_sxm.txtpb", "sm_90a"),
}
TOOLCHAINS = {"tpu": tuple(TPU_TARGETS), "cuda": tuple(GPU_TARGETS)}


@dataclasses.dataclass
class KernelResources:
  """What the back end reports for one Pallas kernel of a compiled program."""
  kernel: str                          # the pallas_call's name
  vmem_bytes: int | None = None        # TPU: scoped VMEM allocations
  spill_bytes: int = 0                 # TPU: vregs spilled to VMEM;
                                       # GPU: ptxas spill stores
  spill_loads: int = 0                 # GPU: ptxas spill loads
  registers: int | None = None         # GPU: registers per thread
  stack_bytes: int | None = None       # GPU: stack frame per thread
  shared_bytes: int | None = None      # GPU: shared memory per block
  threads: int | None = None           # GPU: threads per block
  matmuls: int = 0                     # MXU vmatmul (TPU) or mma/wgmma (GPU)
                                       # instructions in the kernel's code
  wgmma: int = 0                       # GPU: of those, Hopper's wgmma


def environment(toolchain: str, dump_dir: str) -> dict:
  """Environment variables for a process that compiles for ``toolchain``."""
  env = {"JAX_PLATFORMS": "cpu"}
  if toolchain == "tpu":
    env.update({
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": "v5litepod-4",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "TPU_WORKER_ID": "0",
        # The register-allocated LLO of the Pallas kernels only.
        "LIBTPU_INIT_ARGS": " ".join([
            f"--xla_jf_dump_to={dump_dir}/llo", "--xla_jf_dump_llo_text=true",
            "--xla_jf_dump_llo_pass_label_regex=post-ra$",
            "--xla_jf_dump_to_filter=gated_linear|delta_rule|forgetting_attn"]),
    })
  elif toolchain == "cuda":
    env["XLA_FLAGS"] = f"--xla_dump_to={dump_dir}/hlo"
  else:
    raise ValueError(f"toolchain must be one of {tuple(TOOLCHAINS)}, got "
                     f"{toolchain!r}")
  return env


def device(target: str):
  """A deviceless device of ``target`` (a key of TPU_TARGETS or
  GPU_TARGETS)."""
  from jax.experimental import topologies
  if target in TPU_TARGETS:
    name, chip_config, chips = TPU_TARGETS[target]
    topology = topologies.get_topology_desc(
        name, "tpu", chip_config_name=chip_config,
        chips_per_host_bounds=chips, num_slices=1, wrap=(False, False, False))
    return topology.devices[0]
  if target in GPU_TARGETS:
    with open(os.path.join(HERE, "gpu_targets", GPU_TARGETS[target][0])) as f:
      config = f.read()
    return topologies.get_topology_desc(
        platform="cuda", target_config=config, topology="1x1x1").devices[0]
  raise ValueError(f"unknown target {target!r}; known: "
                   f"{sorted(TPU_TARGETS) + sorted(GPU_TARGETS)}")


def compile_kernels(fn, args, target: str, dump_dir: str):
  """Compiles ``jax.jit(fn)`` for ``args`` (``jax.ShapeDtypeStruct``s
  without shardings) on ``target``; returns ``[KernelResources]``, one per
  Pallas kernel. Raises what the compiler raises (errors, VMEM or shared
  memory overflow)."""
  import jax
  dev = device(target)
  sharding = jax.sharding.SingleDeviceSharding(dev)
  args = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
      args)
  clear(dump_dir)
  try:
    with jax.default_device(dev):
      jax.jit(fn).lower(*args).compile()
    if target in TPU_TARGETS:
      return _tpu_resources(dump_dir)
    return _gpu_resources(dump_dir, GPU_TARGETS[target][1])
  finally:
    clear(dump_dir)


def clear(dump_dir: str) -> None:
  for sub in ("hlo", "llo"):
    path = os.path.join(dump_dir, sub)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, exist_ok=True)


_KERNEL = re.compile(
    r"((?:gated_linear|delta_rule|forgetting_attn)(?:_[a-z]+)+)")
_VMEM_ALLOCATION = re.compile(r"space=vmem, size = 0x([0-9a-f]+), scoped, "
                              r"tag = '([^']*)'")


def kernel_name(name: str) -> str:
  """``...-transpose_jvp_gated_linear_dq__.1-00-post-ra.txt`` ->
  ``gated_linear_dq``, ``...-delta_rule_tpu_wy.1-00-post-ra.txt`` ->
  ``delta_rule_tpu_wy``."""
  match = _KERNEL.search(name)
  return match.group(1) if match else name


def _tpu_resources(dump_dir: str):
  """From the register-allocated LLO of each kernel: its VMEM allocations
  (block windows with their double buffers, scratch, spill slots)."""
  found = {}
  for path in glob.glob(os.path.join(dump_dir, "llo", "*-00-post-ra.txt")):
    name = kernel_name(os.path.basename(path))
    if not _KERNEL.fullmatch(name):
      continue
    with open(path) as f:
      text = f.read()
    allocations = [(int(size, 16), tag)
                   for size, tag in _VMEM_ALLOCATION.findall(text)]
    found[name] = KernelResources(
        name, vmem_bytes=sum(size for size, _ in allocations),
        spill_bytes=sum(size for size, tag in allocations
                        if tag == "spilled vreg/vmreg"),
        matmuls=len(re.findall(r"= vmatmul", text)))
  return sorted(found.values(), key=lambda r: r.kernel)


_THUNK = re.compile(r"\] (\S+) grid: \[[^\]]*\] threads: \[(\d+), (\d+), "
                    r"(\d+)\]\s+shared_memory: (\d+) bytes")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill "
                          r"stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def ptxas() -> str:
  """The ptxas of nvidia-cuda-nvcc-cu12 in this environment (as XLA uses)."""
  found = glob.glob(os.path.join(sys.prefix, "lib", "python3*",
                                 "site-packages", "nvidia", "cuda_nvcc", "bin",
                                 "ptxas"))
  if not found and not shutil.which("ptxas"):
    raise FileNotFoundError("no ptxas: install nvidia-cuda-nvcc-cu12")
  return found[0] if found else shutil.which("ptxas")


def _gpu_resources(dump_dir: str, arch: str):
  kernels = {}
  for path in glob.glob(os.path.join(dump_dir, "hlo", "*thunk_sequence.txt")):
    with open(path) as f:
      for match in _THUNK.finditer(f.read()):
        name = match.group(1)
        if _KERNEL.search(name):
          threads = (int(match.group(2)) * int(match.group(3))
                     * int(match.group(4)))
          kernels[name] = KernelResources(name, threads=threads,
                                          shared_bytes=int(match.group(5)))
  for path in glob.glob(os.path.join(dump_dir, "hlo", "*.ptx")):
    with open(path) as f:
      text = f.read()
    entry = re.search(r"\.entry (\w+)", text)
    if not entry or entry.group(1) not in kernels:
      continue
    res = kernels[entry.group(1)]
    res.matmuls = len(re.findall(r"^\s*w?g?mma[.\s]", text, re.M))
    res.wgmma = len(re.findall(r"^\s*wgmma\.mma_async", text, re.M))
    out = subprocess.run(
        [ptxas(), "-v", "-O3", f"-arch={arch}", path, "-o", os.devnull],
        capture_output=True, text=True, check=True).stderr
    spill = _PTXAS_SPILL.search(out)
    res.stack_bytes, res.spill_bytes, res.spill_loads = (
        int(x) for x in spill.groups())
    res.registers = int(_PTXAS_REGS.search(out).group(1))
  return sorted(kernels.values(), key=lambda r: r.kernel)
