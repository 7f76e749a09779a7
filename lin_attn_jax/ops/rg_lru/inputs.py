"""Argument checks of the RG-LRU forms."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.diagonal_ssm.inputs import (check_sequence, check_step,
                                                  check_vector)


def validate(x, a_gate, x_gate, a_param, state, boundaries, *, step,
             unscaled=None):
  """``boundaries`` is ``reset [B]`` for a step, ``segment_ids`` otherwise."""
  names = ("x", "a_gate", "x_gate")
  if step:
    batch, width = check_step(names, (x, a_gate, x_gate))
    checks.check_state("state", state, (batch, width), "[B, D]")
    checks.check_reset(boundaries, batch)
    lead = (batch,)
  else:
    batch, _, width = check_sequence(names, (x, a_gate, x_gate))
    checks.check_state("initial_state", state, (batch, width), "[B, D]")
    checks.check_segment_ids(boundaries, batch, x.shape[1])
    lead = (batch, x.shape[1])
  if unscaled is not None and tuple(jnp.shape(unscaled)) != lead:
    raise ValueError(f"unscaled must have shape {list(lead)} "
                     f"({'[B]' if step else '[B, T]'}), got "
                     f"{list(jnp.shape(unscaled))}")
  if a_param is None:
    raise ValueError("a_param must be given, shape [D]")
  check_vector("a_param", a_param, width)
  return batch, width
