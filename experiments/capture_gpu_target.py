"""Writes the GpuTargetConfigProto (text form) of the local CUDA GPU.

The files in ``experiments/gpu_targets/`` let ``compile_targets.py`` compile
the Pallas kernels for a GPU on a machine without one (deviceless
compilation). Run this once on a machine with the GPU to capture its exact
figures:

  python -m experiments.capture_gpu_target \
      --out=experiments/gpu_targets/NAME.txtpb

The fields are those XLA fills from the CUDA device properties when it
describes a device (``CreateDeviceDescription`` in XLA's stream executor):
the properties are read through CuPy's CUDA runtime bindings; the memory
bandwidth is XLA's ``2 * memory clock * bus width / 8``, ``fpus_per_core``
XLA's table by compute capability, cuDNN's version torch's.
"""

from __future__ import annotations

import subprocess

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "", "Write the proto here (default: stdout).")
flags.DEFINE_integer("device", 0, "CUDA device ordinal.")

# cudaDeviceAttr values (CUDA runtime API); the same in CUDA 12 and 13.
_ATTR_CLOCK_RATE_KHZ = 13
_ATTR_MEMORY_CLOCK_RATE_KHZ = 36
_ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37


def fpus_per_core(major: int, minor: int) -> int:
  """FP32 units per SM, as XLA's ``GetFpusPerCore``."""
  if major == 3:
    return 192
  if major == 5:
    return 128
  if major == 6:
    return 64 if minor == 0 else 128
  if major == 7:
    return 64
  if major == 8:
    return 64 if minor == 0 else 128
  if major >= 9:
    return 128
  raise ValueError(f"unknown compute capability {major}.{minor}")


def _attribute(runtime, attribute, device):
  try:
    return int(runtime.deviceGetAttribute(attribute, device))
  except Exception:  # noqa: BLE001 (the property dict is the fallback)
    return None


def _cudnn_version():
  try:
    import torch
    version = torch.backends.cudnn.version()  # e.g. 91002
  except Exception:  # noqa: BLE001
    return None
  if not version:
    return None
  return version // 10000, (version % 10000) // 100


def target_config(device: int = 0) -> str:
  from cupy.cuda import runtime
  props = runtime.getDeviceProperties(device)
  major, minor = int(props["major"]), int(props["minor"])
  clock_khz = (_attribute(runtime, _ATTR_CLOCK_RATE_KHZ, device)
               or props.get("clockRate"))
  memory_khz = (_attribute(runtime, _ATTR_MEMORY_CLOCK_RATE_KHZ, device)
                or props.get("memoryClockRate"))
  bus_width = (_attribute(runtime, _ATTR_GLOBAL_MEMORY_BUS_WIDTH, device)
               or props.get("memoryBusWidth"))
  grid = props["maxGridSize"]
  name = props["name"]
  name = name.decode() if isinstance(name, bytes) else str(name)
  runtime_version = int(runtime.runtimeGetVersion())  # e.g. 13000
  info = [
      ("threads_per_block_limit", props["maxThreadsPerBlock"]),
      ("threads_per_warp", props["warpSize"]),
      ("shared_memory_per_block", props["sharedMemPerBlock"]),
      ("shared_memory_per_core", props["sharedMemPerMultiprocessor"]),
      ("threads_per_core_limit", props["maxThreadsPerMultiProcessor"]),
      ("core_count", props["multiProcessorCount"]),
      ("fpus_per_core", fpus_per_core(major, minor)),
      ("block_dim_limit_x", grid[0]),
      ("block_dim_limit_y", grid[1]),
      ("block_dim_limit_z", grid[2]),
      ("memory_bandwidth",
       2 * int(memory_khz) * 1000 * int(bus_width) // 8
       if memory_khz and bus_width else None),
      ("l2_cache_size", props["l2CacheSize"]),
      ("clock_rate_ghz", clock_khz / 1e6 if clock_khz else None),
      ("device_memory_size", props["totalGlobalMem"]),
      ("shared_memory_per_block_optin", props["sharedMemPerBlockOptin"]),
  ]
  lines = [f"# GpuTargetConfigProto of an {name} (sm_{major}{minor}), "
           "captured on the device", "# by experiments/capture_gpu_target.py."]
  driver = _driver_version()
  if driver:
    lines.append(f"# Driver {driver}.")
  lines.append("gpu_device_info {")
  for key, value in info:
    if value is not None:
      lines.append(f"  {key}: {value}")
  lines.append(f"  cuda_compute_capability {{ major: {major} minor: {minor} }}")
  lines.append(f"  registers_per_core_limit: {props['regsPerMultiprocessor']}")
  lines.append(f"  registers_per_block_limit: {props['regsPerBlock']}")
  lines.append("}")
  lines.append('platform_name: "CUDA"')
  cudnn = _cudnn_version()
  if cudnn:
    lines.append(f"dnn_version_info {{ major: {cudnn[0]} minor: {cudnn[1]} }}")
  lines.append(f"runtime_version {{ major: {runtime_version // 1000} "
               f"minor: {(runtime_version % 1000) // 10} }}")
  lines.append(f'device_description_str: "{name}"')
  return "\n".join(lines) + "\n"


def _driver_version():
  try:
    return subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.strip().splitlines()[0]
  except Exception:  # noqa: BLE001
    return None


def main(argv):
  del argv
  text = target_config(FLAGS.device)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(text)
  print(text, end="")


if __name__ == "__main__":
  app.run(main)
