"""Validation of the tile sizes that every kernel package's ``BlockSizes``
holds, and the choice of one ``BlockSizes`` per backend.

Tile sizes change speed and memory use, never results beyond float
rounding; a bad one raises ``ValueError`` naming the field and its value.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

BACKENDS = ("tpu", "gpu")

_B = TypeVar("_B")


def is_power_of_two(n: int) -> bool:
  return isinstance(n, int) and n >= 1 and n & (n - 1) == 0


def check_backend(backend, *, allow_none: bool = False) -> None:
  if backend is None and allow_none:
    return
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}"
                     f"{' or None' if allow_none else ''}, got {backend!r}")


def check_positive(name: str, value, *, optional: bool = False) -> None:
  if value is None and optional:
    return
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be {'None or ' if optional else ''}a "
                     f"positive int, got {value!r}")


def check_width(name: str, value, backend: str) -> None:
  """A feature-axis tile (``block_k``, ``block_v``; None: the default):
  whole 128-lane tiles on TPU, a power of two >= 16 on GPU (Triton tiles
  have power-of-two sizes and ``tl.dot`` needs 16 or more)."""
  check_positive(name, value, optional=True)
  if value is None:
    return
  if backend == "tpu" and value % 128:
    raise ValueError(f"on TPU {name} must be a multiple of 128 (lanes), got "
                     f"{value}")
  if backend == "gpu" and (not is_power_of_two(value) or value < 16):
    raise ValueError(f"on GPU {name} must be a power of two >= 16, got "
                     f"{value}")


def check_rows(name: str, value, backend: str) -> None:
  """A row tile (tokens): a multiple of 16 on TPU (bfloat16 packs 16 rows
  per sublane tile), a power of two >= 16 on GPU."""
  check_positive(name, value)
  if backend == "tpu" and value % 16:
    raise ValueError(f"on TPU {name} must be a multiple of 16, got {value}")
  if backend == "gpu" and (not is_power_of_two(value) or value < 16):
    raise ValueError(f"on GPU {name} must be a power of two >= 16, got "
                     f"{value}")


def check_gpu_settings(backend: str, num_warps, num_stages) -> None:
  """``num_warps`` (a power of two) and ``num_stages`` (>= 1) are Triton
  settings: None on TPU."""
  if backend == "tpu":
    if num_warps is not None or num_stages is not None:
      raise ValueError("num_warps and num_stages are GPU settings; leave them "
                       "None on TPU")
    return
  if num_warps is not None and not is_power_of_two(num_warps):
    raise ValueError(f"num_warps must be a power of two, got {num_warps}")
  if num_stages is not None and (not isinstance(num_stages, int)
                                 or num_stages < 1):
    raise ValueError(f"num_stages must be >= 1, got {num_stages}")


def by_backend(block_sizes, cls: type[_B],
               default: Callable[[str], _B]) -> dict[str, _B]:
  """``{backend: blocks}``: the ``cls`` instances given (one, a sequence,
  or None), ``default(backend)`` for the backends not given."""
  if block_sizes is None:
    given: Sequence = []
  elif isinstance(block_sizes, cls):
    given = [block_sizes]
  elif isinstance(block_sizes, (list, tuple)):
    given = list(block_sizes)
  else:
    raise ValueError(f"block_sizes must be {cls.__name__} or a sequence of "
                     f"them, got {block_sizes!r}")
  chosen = {}
  for blocks in given:
    if not isinstance(blocks, cls):
      raise ValueError(f"block_sizes must hold {cls.__name__}, got "
                       f"{blocks!r}")
    chosen[blocks.backend] = blocks
  return {backend: chosen.get(backend) or default(backend)
          for backend in BACKENDS}
