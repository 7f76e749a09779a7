"""GLA's arguments on the gated-linear core: ``g`` has q's shape."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.variant import Variant


def channel_gate(step, q, k, v, g):
  """``g`` must have q's shape; q's rank is checked first, so that a wrong
  q is named as such."""
  layout = "[B, H, K]" if step else "[B, T, H, K]"
  checks.check_rank("q", q, len(layout.split(",")), layout)
  checks.check_shape("g", g, tuple(q.shape), layout)
  return q, k, v, g


GLA = Variant(name="gla", params=("q", "k", "v", "g"), core_arity=4,
              to_core=channel_gate)
