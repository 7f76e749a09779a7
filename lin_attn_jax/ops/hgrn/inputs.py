"""Argument checks of the HGRN forms."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.diagonal_ssm.inputs import check_sequence


def validate(x, g, initial_state, segment_ids):
  batch, length, width = check_sequence(("x", "g"), (x, g))
  checks.check_nonpositive("g", g)
  checks.check_state("initial_state", initial_state, (batch, width), "[B, D]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, width
