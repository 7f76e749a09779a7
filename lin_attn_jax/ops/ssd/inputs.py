"""Validation of Mamba-2's SSD inputs and their mapping onto the GLA core.

The mapping (per head ``h`` of group ``g = h // (H / G)``):

    q = C[g]   k = B[g]   v = x * dt   g_log = dt * A[h]   scale = 1
    state [B, H, N, P] = the GLA core's [B, H, K, V]
    y = GLA output + D * x
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.diagonal_ssm.inputs import check_vector

_F32 = jnp.float32


def _check_groups(B, C, lead, n_heads, lead_layout):
  for name, x in (("B", B), ("C", C)):
    checks.check_rank(name, x, len(lead) + 2, lead_layout[:-1] + ", G, N]")
    checks.check_float(name, x)
    if checks.shape_of(x)[:len(lead)] != tuple(lead):
      raise ValueError(f"{name} must agree with x on {lead_layout} = "
                       f"{tuple(lead)}, got {name} of shape "
                       f"{checks.shape_of(x)}")
  if checks.shape_of(C) != checks.shape_of(B):
    raise ValueError(f"C must have the shape of B {checks.shape_of(B)}, got "
                     f"{checks.shape_of(C)}")
  groups, n_state = checks.shape_of(B)[-2:]
  if groups < 1 or n_heads % groups:
    raise ValueError(f"the H = {n_heads} heads of x must be a multiple of the "
                     f"G = {groups} groups of B and C (B has shape "
                     f"{checks.shape_of(B)})")
  return groups, n_state


def _check_head_params(n_heads, A, D, dt_bias):
  check_vector("A", A, n_heads, "[H]")
  checks.check_nonpositive("A", A)
  check_vector("D", D, n_heads, "[H]")
  check_vector("dt_bias", dt_bias, n_heads, "[H]")


def _check_dt(dt, dt_bias, lead, lead_layout, dt_softplus):
  """Without softplus the time step ``dt + dt_bias`` itself must be >= 0."""
  checks.check_float("dt", dt)
  checks.check_shape("dt", dt, lead, lead_layout)
  if dt_softplus:
    return
  step = checks.concrete(dt)
  bias = None if dt_bias is None else checks.concrete(dt_bias)
  if step is None or (dt_bias is not None and bias is None):
    return
  step = step.astype(np.float32) + (0.0 if bias is None
                                    else bias.astype(np.float32))
  if np.any(step < 0):
    raise ValueError("dt (+ dt_bias) must be >= 0 without dt_softplus (dt * A "
                     f"is a log-decay); got a minimum of {float(step.min())}")


def validate(x, dt, A, B, C, D, dt_bias, dt_softplus, initial_state,
             segment_ids):
  """Checks a sequence call; returns ``(B, T, H, P, G, N)``."""
  checks.check_rank("x", x, 4, "[B, T, H, P]")
  checks.check_float("x", x)
  batch, length, n_heads, head_dim = checks.shape_of(x)
  _check_head_params(n_heads, A, D, dt_bias)
  _check_dt(dt, dt_bias, (batch, length, n_heads), "[B, T, H]", dt_softplus)
  groups, n_state = _check_groups(B, C, (batch, length), n_heads, "[B, T]")
  checks.check_state("initial_state", initial_state,
                     (batch, n_heads, n_state, head_dim), "[B, H, N, P]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, n_heads, head_dim, groups, n_state


def validate_step(x, dt, A, B, C, D, dt_bias, dt_softplus, state, reset):
  """Checks one decoding step; returns ``(B, H, P, G, N)``."""
  checks.check_rank("x", x, 3, "[B, H, P]")
  checks.check_float("x", x)
  batch, n_heads, head_dim = checks.shape_of(x)
  _check_head_params(n_heads, A, D, dt_bias)
  _check_dt(dt, dt_bias, (batch, n_heads), "[B, H]", dt_softplus)
  groups, n_state = _check_groups(B, C, (batch,), n_heads, "[B]")
  checks.check_state("state", state, (batch, n_heads, n_state, head_dim),
                     "[B, H, N, P]")
  checks.check_reset(reset, batch)
  return batch, n_heads, head_dim, groups, n_state


def time_step(dt, dt_bias, dt_softplus):
  """``dt (+ dt_bias)``, through softplus when asked; float32 ``[..., H]``."""
  dt = jnp.asarray(dt, _F32)
  if dt_bias is not None:
    dt = dt + jnp.asarray(dt_bias, _F32)
  return jax.nn.softplus(dt) if dt_softplus else dt


def to_gated_linear(x, dt, A, B, C, dt_bias, dt_softplus):
  """The GLA core's ``(q, k, v, g)`` for a sequence call (float32).

  ``B``/``C`` are broadcast from groups to heads (``jnp.repeat``: head ``h``
  reads group ``h // (H / G)``); their gradients sum back over the heads.
  """
  n_heads = x.shape[2]
  per_group = n_heads // B.shape[2]
  step = time_step(dt, dt_bias, dt_softplus)                    # [B, T, H]
  q = jnp.repeat(jnp.asarray(C, _F32), per_group, axis=2)       # [B, T, H, N]
  k = jnp.repeat(jnp.asarray(B, _F32), per_group, axis=2)       # [B, T, H, N]
  v = jnp.asarray(x, _F32) * step[..., None]                    # [B, T, H, P]
  g = step * jnp.asarray(A, _F32)                               # [B, T, H]
  return q, k, v, g


def add_skip(y, x, D):
  """``y + D x`` (float32) for ``y, x: [..., H, P]`` and ``D: [H]``."""
  if D is None:
    return y
  # An einsum: D's gradient is then a dot_general, several times faster on
  # CPU than the multiply-and-reduce of a broadcast multiply.
  return y + jnp.einsum("h,...hp->...hp", jnp.asarray(D, _F32),
                        jnp.asarray(x, _F32))
