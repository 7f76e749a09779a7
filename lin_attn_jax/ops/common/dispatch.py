"""``impl="auto" | "xla" | "pallas"``: which implementation a chunk form runs.

- ``"xla"``: the chunk form in plain JAX, on any backend.
- ``"pallas"``: the Pallas kernel, chosen by the platform the call is lowered
  for (``jax.lax.platform_dependent``): Mosaic on TPU, Triton on CUDA GPUs,
  and on any other platform the kernel in interpret mode (slow; for tests and
  debugging). ``jax.export`` for ``platforms=["tpu"]`` or ``["cuda"]`` from
  a CPU-only machine yields the kernel of that platform.
- ``"auto"``: where the default backend is a TPU or GPU, what
  ``AUTO_ON_TPU`` and ``AUTO_ON_CUDA`` say for the op's family on those
  platforms, and the XLA form on any other platform, again by lowering
  platform; where the default backend is the CPU, the XLA form (without
  tracing the kernels). A kernel is the default on a platform only where a
  committed measurement on it shows the kernel faster than the XLA form.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import jax

IMPLS = ("auto", "xla", "pallas")

_T = TypeVar("_T")

# The default backend of this process; a name of its own so tests can set it.
_default_backend = jax.default_backend


# What ``impl="auto"`` runs on CUDA, per family of kernels: the kernel only
# where a committed measurement on a GPU shows it faster than the XLA chunk
# form, forward and forward+backward (benchmarks/RESULTS_kernels.md; see
# docs/performance.md): the chunk-parallel gated-linear kernels and the
# delta-rule sweep kernels; ``impl="auto"`` keeps running the sweeps for the
# delta rule until the chunk-parallel delta-rule kernels (what
# ``impl="pallas"`` runs there in bfloat16) are measured. The
# forgetting-attention kernels have not run on a GPU yet: the XLA blockwise
# form until a measurement backs them. ``impl="pallas"`` runs the kernel
# anywhere.
AUTO_ON_CUDA = {"gated_linear": "pallas", "delta_rule": "pallas",
                "forgetting_attn": "xla"}
# What ``impl="auto"`` runs on TPU, per family, by the same rule: no TPU has
# run the kernels yet (their compiler figures are in
# benchmarks/RESULTS_compile.md; no timing), so the XLA chunk forms.
AUTO_ON_TPU = {"gated_linear": "xla", "delta_rule": "xla",
               "forgetting_attn": "xla"}


def check_impl(impl) -> None:
  if impl not in IMPLS:
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def run(impl: str, xla: Callable[[], _T], pallas: Callable[[], _T], *,
        family: str, auto_pallas: Callable[[], _T] | None = None) -> _T:
  """Calls ``xla()`` or ``pallas()`` (both without arguments) per ``impl``;
  ``family`` (a key of ``AUTO_ON_CUDA`` and ``AUTO_ON_TPU``) names the
  kernels ``pallas`` runs.
  ``auto_pallas``: the kernels ``impl="auto"`` runs where it runs kernels,
  when they are not ``pallas`` (kernels measured faster than the XLA form,
  beside newer ones that ``impl="pallas"`` runs but no measurement backs
  yet)."""
  check_impl(impl)
  if impl == "xla":
    return xla()
  if impl == "pallas":
    return pallas()
  if _default_backend() not in ("tpu", "gpu"):
    return xla()
  kernels = pallas if auto_pallas is None else auto_pallas
  cuda = kernels if AUTO_ON_CUDA[family] == "pallas" else xla
  tpu = kernels if AUTO_ON_TPU[family] == "pallas" else xla
  return jax.lax.platform_dependent(tpu=tpu, cuda=cuda, default=xla)
