"""Input validation shared by every op.

Every public form validates its arguments with these helpers, so that a bad
call fails with a ``ValueError`` that names the argument and the shapes seen,
before any tracing error from deep inside an einsum.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def shape_of(x) -> tuple[int, ...]:
  return tuple(np.shape(x))


def check_float(name: str, x) -> None:
  """Raises unless ``x`` has a floating dtype."""
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(f"{name} must have a floating dtype, got {dtype} "
                     f"(shape {shape_of(x)})")


def check_rank(name: str, x, rank: int, layout: str) -> None:
  """Raises unless ``x`` has ``rank`` dimensions; ``layout`` names them."""
  if np.ndim(x) != rank:
    raise ValueError(f"{name} must have rank {rank} ({layout}), got shape "
                     f"{shape_of(x)}")


def check_shape(name: str, x, expected: Sequence[int], layout: str) -> None:
  """Raises unless ``x`` has exactly the shape ``expected``."""
  if shape_of(x) != tuple(expected):
    raise ValueError(f"{name} must have shape {tuple(expected)} ({layout}), "
                     f"got {shape_of(x)}")


def check_qkv(q, k, v, *, names=("q", "k", "v")):
  """Validates ``[B, T, H, K]`` queries/keys and ``[B, T, H, V]`` values.

  Returns:
    ``(B, T, H, K, V)``.
  """
  nq, nk, nv = names
  for name, x in zip(names, (q, k, v)):
    check_rank(name, x, 4, "[B, T, H, K]" if name != nv else "[B, T, H, V]")
    check_float(name, x)
  b, t, h, dk = shape_of(q)
  if shape_of(k) != (b, t, h, dk):
    raise ValueError(f"{nk} must have the shape of {nq} [B, T, H, K] = "
                     f"{shape_of(q)}, got {shape_of(k)}")
  if shape_of(v)[:3] != (b, t, h):
    raise ValueError(f"{nv} must agree with {nq} on [B, T, H] = {(b, t, h)}, "
                     f"got {nv} of shape {shape_of(v)}")
  return b, t, h, dk, shape_of(v)[3]


def check_qkv_step(q, k, v, *, names=("q", "k", "v")):
  """Validates one decoding step: ``[B, H, K]`` q/k and ``[B, H, V]`` v.

  Returns:
    ``(B, H, K, V)``.
  """
  nq, nk, nv = names
  for name, x in zip(names, (q, k, v)):
    check_rank(name, x, 3, "[B, H, K]" if name != nv else "[B, H, V]")
    check_float(name, x)
  b, h, dk = shape_of(q)
  if shape_of(k) != (b, h, dk):
    raise ValueError(f"{nk} must have the shape of {nq} [B, H, K] = "
                     f"{shape_of(q)}, got {shape_of(k)}")
  if shape_of(v)[:2] != (b, h):
    raise ValueError(f"{nv} must agree with {nq} on [B, H] = {(b, h)}, got "
                     f"{nv} of shape {shape_of(v)}")
  return b, h, dk, shape_of(v)[2]


def check_state(name: str, state, expected: Sequence[int], layout: str):
  """Validates an optional recurrent state of a known shape."""
  if state is None:
    return
  check_float(name, state)
  check_shape(name, state, expected, layout)


def check_segment_ids(segment_ids, batch: int, length: int) -> None:
  """Validates optional ``[B, T]`` integer segment ids."""
  if segment_ids is None:
    return
  dtype = jnp.result_type(segment_ids)
  if not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"segment_ids must have an integer dtype, got {dtype}")
  check_shape("segment_ids", segment_ids, (batch, length), "[B, T]")


def check_reset(reset, batch: int) -> None:
  """Validates an optional ``[B]`` boolean reset flag of a decoding step."""
  if reset is None:
    return
  check_shape("reset", reset, (batch,), "[B]")


def concrete(x):
  """``x`` as a NumPy array, or None when it is traced.

  Value checks run only on concrete arrays, and in NumPy: inside ``jit``,
  ``lax.scan`` or ``grad`` a concrete array closed over is still concrete,
  but a ``jnp`` operation on it is traced, and turning that into a Python
  bool raises. So a check reads ``values = concrete(x)`` and skips itself
  when ``values is None``.
  """
  if isinstance(x, jax.core.Tracer):
    return None
  return np.asarray(x)


def check_nonpositive(name: str, x) -> None:
  """Raises if a concrete log-decay has a positive entry (traced values are
  not inspected)."""
  values = concrete(x)
  if values is not None and np.any(values > 0):
    raise ValueError(f"{name} holds log-decays, which must be <= 0; got a "
                     f"maximum of {float(values.max())} (shape {shape_of(x)})")


def check_negative(name: str, x, what: str) -> None:
  """Raises if a concrete ``x`` has an entry ``>= 0``; ``what`` says why it
  must be negative (traced values are not inspected)."""
  values = concrete(x)
  if values is not None and np.any(values >= 0):
    raise ValueError(f"{name} must be < 0 ({what}); got a maximum of "
                     f"{float(values.max())} (shape {shape_of(x)})")


def positive_int(name: str, value, *, allow_none: bool = False,
                 also: str = ""):
  """Returns ``value`` if it is an int (not a bool) ``>= 1``, or None when
  ``allow_none``; raises ``ValueError`` naming ``name`` otherwise. ``also``
  names other accepted values for the message (``" or 'auto'"``)."""
  if value is None and allow_none:
    return None
  if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
      or value < 1):
    accepted = " or None" if allow_none else ""
    raise ValueError(f"{name} must be a positive int{accepted}{also}, got "
                     f"{value!r}")
  return value


def check_chunk_size(chunk_size: int, name: str = "chunk_size") -> None:
  """A chunk length (``chunk_size``, ``sub_chunk_size``): a positive int."""
  positive_int(name, chunk_size)


def check_chunk_sizes(chunk_size: int, sub_chunk_size: int) -> None:
  """Both positive integers, the sub-chunk dividing the chunk (a sub-chunk
  longer than the chunk is the chunk)."""
  check_chunk_size(chunk_size)
  check_chunk_size(sub_chunk_size, "sub_chunk_size")
  if chunk_size % min(sub_chunk_size, chunk_size):
    raise ValueError(f"sub_chunk_size ({sub_chunk_size}) must divide "
                     f"chunk_size ({chunk_size})")
