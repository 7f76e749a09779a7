"""A workaround for a crash of XLA's CPU back end, applied on import.

jaxlib 0.10.2 and 0.11.0 hand multiply-reduce fusions to YNNPACK, whose
kernels crash (SIGSEGV) or hang on some x86-64 CPUs when the operands have
rank 7 or more and a size-1 axis (https://github.com/jax-ml/jax/issues/39257,
https://github.com/jax-ml/jax/issues/40412; fixed in XNNPACK after 0.11.0).
The per-key-channel decay factors here are such products (KDA, RWKV-6 and
RWKV-7: the gradients of the parallel forms, and of the chunk forms when
the batch or the number of chunks is 1): on a 2-core AMD EPYC (AVX2) the
gradient of ``parallel_rwkv6`` at T = 50 segfaults every time.

With an affected jaxlib, importing ``lin_attn_jax`` adds
``--xla_cpu_experimental_ynn_fusion_type=-reduce`` to ``XLA_FLAGS`` (such
reductions then take XLA's own emitter), unless ``XLA_FLAGS`` already sets
that flag. XLA reads ``XLA_FLAGS`` when the first computation starts the
back end: import ``lin_attn_jax`` before running any JAX computation, or set
the flag yourself; otherwise a warning says that it came too late.

The flag also keeps small per-token reductions (Mamba's selective scan)
fast; check that scan before dropping it (docs/performance.md).
"""

from __future__ import annotations

import os
import warnings

AFFECTED_JAXLIB = ("0.10.2", "0.11.0")
FLAG = "--xla_cpu_experimental_ynn_fusion_type=-reduce"


def _backends_started() -> bool:
  try:
    from jax._src import xla_bridge
    return xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):
    return False


def avoid_ynn_reduce_crash() -> bool:
  """Adds ``FLAG`` to ``XLA_FLAGS`` for an affected jaxlib; True if added."""
  import jaxlib

  flags = os.environ.get("XLA_FLAGS", "")
  if (jaxlib.__version__ not in AFFECTED_JAXLIB
      or "xla_cpu_experimental_ynn_fusion_type" in flags):
    return False
  os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
  if _backends_started():
    warnings.warn(
        f"lin_attn_jax was imported after JAX started its back ends, so "
        f"{FLAG} (a workaround for a crash of jaxlib {jaxlib.__version__} "
        f"on CPU, see lin_attn_jax/xla_workarounds.py) does not take "
        f"effect; import lin_attn_jax first or set it in XLA_FLAGS",
        RuntimeWarning, stacklevel=3)
  return True
