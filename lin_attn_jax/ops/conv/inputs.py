"""Validation of the short causal convolution's inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.diagonal_ssm.inputs import check_vector

# The direct forms add one shifted copy of the input per tap; past this width
# an FFT convolution is the better tool (see ``lin_attn_jax.ops.h3``).
MAX_WIDTH = 64

ACTIVATIONS = {
    None: lambda x: x,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def check_weight(weight, width_channels):
  """``weight: [D, W]`` with ``1 <= W <= MAX_WIDTH``; returns ``W``."""
  checks.check_rank("weight", weight, 2, "[D, W]")
  checks.check_float("weight", weight)
  channels, taps = checks.shape_of(weight)
  if channels != width_channels:
    raise ValueError(f"weight must have shape [D, W] with D = {width_channels} "
                     f"(the channels of x), got {checks.shape_of(weight)}")
  if not 1 <= taps <= MAX_WIDTH:
    raise ValueError(f"weight has W = {taps} taps; a causal_conv1d must have "
                     f"1 <= W <= {MAX_WIDTH} (shape {checks.shape_of(weight)})")
  return taps


def check_activation(activation):
  if activation not in ACTIVATIONS:
    raise ValueError(f"activation must be one of {sorted(map(str, ACTIVATIONS))}"
                     f", got {activation!r}")


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
