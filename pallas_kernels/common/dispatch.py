"""Which kernel a call runs: by ``backend``, or by the platform the call is
lowered for (``jax.lax.platform_dependent``): ``tpu`` -> Mosaic, ``cuda`` ->
Triton, anything else -> the Mosaic kernel in interpret mode (slow; for
tests and debugging on CPU)."""

from __future__ import annotations

import contextlib
import functools

import jax

from pallas_kernels.common.blocks import check_backend


def check_call(backend, interpret) -> None:
  """The ``backend`` and ``interpret`` arguments of a kernel entry point."""
  check_backend(backend, allow_none=True)
  if interpret and backend is None:
    raise ValueError("interpret=True needs an explicit backend ('tpu' or "
                     "'gpu'); with backend=None a CPU call already runs in "
                     "interpret mode")


def by_platform(backend, interpret: bool, fn, *args):
  """``fn(backend, interpret, *args)``, with ``backend`` None: per lowering
  platform."""
  if backend is not None:
    return fn(backend, interpret, *args)
  return jax.lax.platform_dependent(
      *args, tpu=functools.partial(fn, "tpu", False),
      cuda=functools.partial(fn, "gpu", False),
      default=functools.partial(fn, "tpu", True))


_ASSUMED_CAPABILITY: list[tuple[int, int]] = []


@contextlib.contextmanager
def assume_cuda_capability(capability: tuple[int, int]):
  """Within it, ``cuda_capability()`` is ``capability``: to trace the
  kernels that a GPU of that generation would run on a machine without
  one (the compile report's grids)."""
  _ASSUMED_CAPABILITY.append(tuple(capability))
  try:
    yield
  finally:
    _ASSUMED_CAPABILITY.pop()


def cuda_capability() -> tuple[int, int] | None:
  """The compute capability of the GPU that kernels are being traced for:
  the default device (``jax.default_device``, as a deviceless compilation
  sets it) or else the first device, when it is a CUDA GPU; None otherwise
  (CPU, TPU). Tile settings that differ between GPU generations read it;
  None must select settings that compile on every generation."""
  if _ASSUMED_CAPABILITY:
    return _ASSUMED_CAPABILITY[-1]
  device = jax.config.jax_default_device
  if device is None or isinstance(device, str):
    try:
      device = jax.devices()[0]
    except RuntimeError:
      return None
  capability = getattr(device, "compute_capability", None)
  if not capability:
    return None
  major, minor = str(capability).split(".")[:2]
  return int(major), int(minor)
