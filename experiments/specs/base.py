"""What the forms verifier and the forms benchmark need to know about an op."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Dims:
  """Problem size. Each op reads the fields it has a use for."""
  batch: int = 2        # B
  length: int = 200     # T
  heads: int = 2        # H (heads, or groups for Mamba-style ops)
  dim_k: int = 32       # K (key / state size N)
  dim_v: int = 48       # V (value / head size P / model width D)


@dataclasses.dataclass(frozen=True)
class OpSpec:
  """An op with all its forms, and how to make inputs for it.

  Every form is called as ``form(**inputs)`` and returns ``(o, state)``;
  the ``"naive"`` form is the reference the others are checked against.
  """
  name: str                                   # op name, e.g. "gla"
  forms: Mapping[str, Callable]               # form name -> callable
  make_inputs: Callable[..., dict]            # (key, Dims, strong: bool) -> kwargs
  grad_args: tuple[str, ...]                  # inputs the gradients are checked for
  chunked: tuple[str, ...] = ("chunk",)       # forms that take chunk_size
  tol: float = 1e-5                           # float32 relative RMS, outputs
  grad_tol: float = 1e-5                      # float32 relative RMS, gradients
  low_precision_tol: float = 1e-2             # bfloat16 inputs, all quantities
