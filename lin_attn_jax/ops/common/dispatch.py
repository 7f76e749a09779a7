"""``impl="auto" | "xla" | "pallas"``: which implementation a chunk form runs.

- ``"xla"``: the chunk form in plain JAX, on any backend.
- ``"pallas"``: the Pallas kernel, chosen by the platform the call is lowered
  for (``jax.lax.platform_dependent``): Mosaic on TPU, Triton on CUDA GPUs,
  and on any other platform the kernel in interpret mode (slow; for tests and
  debugging). ``jax.export`` for ``platforms=["tpu"]`` or ``["cuda"]`` from
  a CPU-only machine yields the kernel of that platform.
- ``"auto"``: where the default backend is a TPU or GPU, the kernel on TPU
  and CUDA and the XLA form on any other platform, again by lowering
  platform; where the default backend is the CPU, the XLA form (without
  tracing the kernels).
"""

from __future__ import annotations

from typing import Callable, TypeVar

import jax

IMPLS = ("auto", "xla", "pallas")

_T = TypeVar("_T")

# The default backend of this process; a name of its own so tests can set it.
_default_backend = jax.default_backend


def check_impl(impl) -> None:
  if impl not in IMPLS:
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def run(impl: str, xla: Callable[[], _T], pallas: Callable[[], _T]) -> _T:
  """Calls ``xla()`` or ``pallas()`` (both without arguments) per ``impl``."""
  check_impl(impl)
  if impl == "xla":
    return xla()
  if impl == "pallas":
    return pallas()
  if _default_backend() not in ("tpu", "gpu"):
    return xla()
  return jax.lax.platform_dependent(tpu=pallas, cuda=pallas, default=xla)
