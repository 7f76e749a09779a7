"""Validation of the linear scan's inputs, shared by the ops built on it."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks

_F32 = jnp.float32


def check_same_shape(name: str, x, ref_name: str, ref) -> None:
  if checks.shape_of(x) != checks.shape_of(ref):
    raise ValueError(f"{name} must have the shape of {ref_name} "
                     f"{checks.shape_of(ref)}, got {checks.shape_of(x)}")


def check_sequence(names, arrays, layout: str = "[B, T, D]"):
  """Validates float ``[B, T, D]`` arrays of one shape; returns the shape."""
  for name, x in zip(names, arrays):
    checks.check_rank(name, x, 3, layout)
    checks.check_float(name, x)
  for name, x in zip(names[1:], arrays[1:]):
    check_same_shape(name, x, names[0], arrays[0])
  return checks.shape_of(arrays[0])


def check_step(names, arrays, layout: str = "[B, D]"):
  """Validates float ``[B, D]`` arrays of one shape; returns ``(B, D)``."""
  for name, x in zip(names, arrays):
    checks.check_rank(name, x, 2, layout)
    checks.check_float(name, x)
  for name, x in zip(names[1:], arrays[1:]):
    check_same_shape(name, x, names[0], arrays[0])
  return checks.shape_of(arrays[0])


def check_vector(name: str, x, size: int, layout: str = "[D]") -> None:
  """Validates an optional float per-channel parameter of shape ``[size]``."""
  if x is None:
    return
  checks.check_float(name, x)
  checks.check_shape(name, x, (size,), layout)


def validate(a, b, initial_state, segment_ids):
  """Checks a sequence call of the linear scan; returns ``(B, T, D)``."""
  batch, length, width = check_sequence(("a", "b"), (a, b))
  checks.check_state("initial_state", initial_state, (batch, width), "[B, D]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, width


def validate_step(a, b, state, reset):
  """Checks one decoding step of the linear scan; returns ``(B, D)``."""
  batch, width = check_step(("a", "b"), (a, b))
  checks.check_state("state", state, (batch, width), "[B, D]")
  checks.check_reset(reset, batch)
  return batch, width


def initial(state, shape, dtype=_F32):
  """The float32 state to start from: ``state``, or zeros of ``shape``."""
  if state is None:
    return jnp.zeros(shape, dtype)
  return jnp.asarray(state, dtype)
