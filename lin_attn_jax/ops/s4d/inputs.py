"""Argument checks of the S4D forms."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.diagonal_ssm.inputs import check_vector


def check_params(channels, log_dt, A_real, A_imag, B, C, D):
  check_vector("log_dt", log_dt, channels)
  checks.check_rank("A_real", A_real, 2, "[D, N]")
  checks.check_float("A_real", A_real)
  if checks.shape_of(A_real)[0] != channels:
    raise ValueError(f"A_real must have shape [D, N] with D = {channels}, got "
                     f"{checks.shape_of(A_real)}")
  n_modes = checks.shape_of(A_real)[1]
  checks.check_float("A_imag", A_imag)
  checks.check_shape("A_imag", A_imag, (channels, n_modes), "[D, N]")
  for name, x in (("B", B), ("C", C)):
    checks.check_float(name, x)
    checks.check_shape(name, x, (channels, n_modes, 2), "[D, N, 2]")
  check_vector("D", D, channels)
  checks.check_negative("A_real", A_real, "a decaying mode")
  return n_modes


def validate(u, log_dt, A_real, A_imag, B, C, D, initial_state, segment_ids):
  checks.check_rank("u", u, 3, "[B, T, D]")
  checks.check_float("u", u)
  batch, length, channels = checks.shape_of(u)
  n_modes = check_params(channels, log_dt, A_real, A_imag, B, C, D)
  checks.check_state("initial_state", initial_state,
                     (batch, channels, n_modes, 2), "[B, D, N, 2]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, channels, n_modes
