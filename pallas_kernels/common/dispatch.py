"""Which kernel a call runs: by ``backend``, or by the platform the call is
lowered for (``jax.lax.platform_dependent``): ``tpu`` -> Mosaic, ``cuda`` ->
Triton, anything else -> the Mosaic kernel in interpret mode (slow; for
tests and debugging on CPU)."""

from __future__ import annotations

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
