"""Validation of the short causal convolution's inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.diagonal_ssm.inputs import check_vector

# The direct forms add one shifted copy of the input per tap (or, in the
# Toeplitz form, multiply chunks by ``[L, L]`` tap matrices); a longer
# memory is the job of an SSM (``lin_attn_jax.ops.s4d``).
MAX_WIDTH = 64

ACTIVATIONS = {
    None: lambda x: x,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def check_weight(weight, width_channels, name="weight", layout="[D, W]"):
  """``weight: [D, W]`` with ``1 <= W <= MAX_WIDTH``; returns ``W``."""
  checks.check_rank(name, weight, 2, layout)
  checks.check_float(name, weight)
  channels, taps = checks.shape_of(weight)
  if channels != width_channels:
    raise ValueError(f"{name} must have shape {layout} with D = "
                     f"{width_channels} (the channels of the input), got "
                     f"{checks.shape_of(weight)}")
  if not 1 <= taps <= MAX_WIDTH:
    raise ValueError(f"{name} has {taps} taps; the direct convolution forms "
                     f"take 1 to {MAX_WIDTH} (shape {checks.shape_of(weight)})")
  return taps


def check_activation(activation):
  if activation not in ACTIVATIONS:
    names = sorted(map(str, ACTIVATIONS))
    raise ValueError(f"activation must be one of {names}, got {activation!r}")


def validate(x, weight, bias, activation, initial_state, segment_ids):
  """Checks a sequence call; returns ``(B, T, D, W)``."""
  checks.check_rank("x", x, 3, "[B, T, D]")
  checks.check_float("x", x)
  batch, length, channels = checks.shape_of(x)
  taps = check_weight(weight, channels)
  check_vector("bias", bias, channels)
  check_activation(activation)
  checks.check_state("initial_state", initial_state,
                     (batch, taps - 1, channels), "[B, W - 1, D]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, channels, taps


def validate_step(x, weight, bias, activation, state, reset):
  """Checks one decoding step; returns ``(B, D, W)``."""
  checks.check_rank("x", x, 2, "[B, D]")
  checks.check_float("x", x)
  batch, channels = checks.shape_of(x)
  taps = check_weight(weight, channels)
  check_vector("bias", bias, channels)
  check_activation(activation)
  checks.check_state("state", state, (batch, taps - 1, channels),
                     "[B, W - 1, D]")
  checks.check_reset(reset, batch)
  return batch, channels, taps


def finish(y, bias, activation):
  """Adds the bias and applies the activation (float32)."""
  if bias is not None:
    y = y + jnp.asarray(bias, jnp.float32)
  return ACTIVATIONS[activation](y)
