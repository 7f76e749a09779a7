"""Argument checks of the shift-SSM forms."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.conv.inputs import check_weight
from lin_attn_jax.ops.diagonal_ssm.inputs import check_vector


def check_C(C, channels, *, direct):
  """``C: [D, N]``; the direct forms also need ``N <= MAX_WIDTH``."""
  if direct:
    return check_weight(C, channels, name="C", layout="[D, N]")
  checks.check_rank("C", C, 2, "[D, N]")
  checks.check_float("C", C)
  if checks.shape_of(C)[0] != channels or checks.shape_of(C)[1] < 1:
    raise ValueError(f"C must have shape [D, N] with D = {channels} and "
                     f"N >= 1, got {checks.shape_of(C)}")
  return checks.shape_of(C)[1]


def validate(u, C, D, initial_state, segment_ids, *, direct=True):
  checks.check_rank("u", u, 3, "[B, T, D]")
  checks.check_float("u", u)
  batch, length, channels = checks.shape_of(u)
  n_state = check_C(C, channels, direct=direct)
  check_vector("D", D, channels)
  checks.check_state("initial_state", initial_state,
                     (batch, n_state - 1, channels), "[B, N - 1, D]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, channels, n_state
