"""Validation and preparation of the selective scan's inputs.

Channels are split into ``G`` groups of ``R = D / G`` channels; channel ``d``
reads ``B`` and ``C`` of group ``d // R``. Internally every per-channel array
is viewed as ``[..., G, R]`` so that ``B`` and ``C`` broadcast over ``R``
without being copied to every channel.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.diagonal_ssm.inputs import (check_same_shape,
                                                  check_sequence, check_step,
                                                  check_vector)

_F32 = jnp.float32

# Tokens between saved states in the chunk forms (see
# ``chunk.chunk_selective_scan``); the Mamba layer's default too.
CHUNK_SIZE = 32


@dataclasses.dataclass(frozen=True)
class Dims:
  batch: int     # B
  width: int     # D, channels
  state: int     # N, state size per channel
  groups: int    # G, groups sharing B and C


def _check_A(A, width):
  checks.check_float("A", A)
  if checks.shape_of(A)[:1] != (width,) or len(checks.shape_of(A)) != 2:
    raise ValueError(f"A must have shape [D, N] with D = {width} (the "
                     f"channels of u), got {checks.shape_of(A)}")
  return checks.shape_of(A)[1]


def _check_projection(name, x, lead, n_state, width, lead_layout):
  """``B``/``C``: ``lead + (N,)`` or ``lead + (G, N)``; returns ``G``."""
  checks.check_float(name, x)
  shape = checks.shape_of(x)
  if len(shape) == len(lead) + 1 and shape == tuple(lead) + (n_state,):
    return 1
  if (len(shape) == len(lead) + 2 and shape[:len(lead)] == tuple(lead)
      and shape[-1] == n_state):
    groups = shape[-2]
    if groups < 1 or width % groups:
      raise ValueError(f"{name} has {groups} groups, which must divide the "
                       f"D = {width} channels (shape {shape})")
    return groups
  raise ValueError(f"{name} must have shape {tuple(lead) + (n_state,)} "
                   f"{lead_layout[:-1]}, N] or {tuple(lead) + ('G', n_state)} "
                   f"{lead_layout[:-1]}, G, N] with N = {n_state} from A, "
                   f"got {shape}")


def validate(u, delta, A, B, C, D, z, delta_bias, initial_state, segment_ids):
  """Checks a sequence call; returns ``Dims``."""
  batch, length, width = check_sequence(("u", "delta"), (u, delta))
  if z is not None:
    checks.check_float("z", z)
    check_same_shape("z", z, "u", u)
  n_state = _check_A(A, width)
  groups = _check_projection("B", B, (batch, length), n_state, width,
                             "[B, T, N]")
  _check_projection("C", C, (batch, length), n_state, width, "[B, T, N]")
  check_same_shape("C", C, "B", B)
  check_vector("D", D, width)
  check_vector("delta_bias", delta_bias, width)
  checks.check_state("initial_state", initial_state, (batch, width, n_state),
                     "[B, D, N]")
  checks.check_segment_ids(segment_ids, batch, length)
  return Dims(batch, width, n_state, groups)


def validate_step(u, delta, A, B, C, D, z, delta_bias, state, reset):
  """Checks one decoding step; returns ``Dims``."""
  batch, width = check_step(("u", "delta"), (u, delta))
  if z is not None:
    checks.check_float("z", z)
    check_same_shape("z", z, "u", u)
  n_state = _check_A(A, width)
  groups = _check_projection("B", B, (batch,), n_state, width, "[B, N]")
  _check_projection("C", C, (batch,), n_state, width, "[B, N]")
  check_same_shape("C", C, "B", B)
  check_vector("D", D, width)
  check_vector("delta_bias", delta_bias, width)
  checks.check_state("state", state, (batch, width, n_state), "[B, D, N]")
  checks.check_reset(reset, batch)
  return Dims(batch, width, n_state, groups)


def time_step(delta, delta_bias, delta_softplus):
  """``dt = delta (+ delta_bias)``, through softplus when asked; float32."""
  dt = jnp.asarray(delta, _F32)
  if delta_bias is not None:
    dt = dt + jnp.asarray(delta_bias, _F32)
  return jax.nn.softplus(dt) if delta_softplus else dt


def grouped(x, groups):
  """Per-channel ``[..., D]`` -> ``[..., G, R]`` (float32)."""
  x = jnp.asarray(x, _F32)
  return x.reshape(x.shape[:-1] + (groups, x.shape[-1] // groups))


def grouped_projection(x, lead_ndim):
  """``B``/``C`` with ``lead_ndim`` leading axes -> ``[..., G, N]`` float32
  (``G = 1`` when not grouped)."""
  x = jnp.asarray(x, _F32)
  if x.ndim == lead_ndim + 1:
    x = x[..., None, :]
  return x


def finish(y, u, D, z):
  """``(y + D u) * silu(z)`` in float32, from ``y: [..., D]``."""
  u = jnp.asarray(u, _F32)
  if D is not None:
    y = y + jnp.asarray(D, _F32) * u
  if z is not None:
    y = y * jax.nn.silu(jnp.asarray(z, _F32))
  return y
