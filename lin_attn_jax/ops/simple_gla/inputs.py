"""Simple GLA's arguments on the gated-linear core: one scalar log-decay per
head and token (``g``) or per head (``g_gamma``)."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.variant import Variant


def scalar_decay(q, g, g_gamma, lead_layout="[B, T, H]"):
  """Resolves ``g`` / ``g_gamma`` to one scalar log-decay per head and token.

  ``q`` is ``[B, T, H, K]`` (or ``[B, H, K]`` for a step); returns ``None``
  (no decay), ``g`` itself, or ``g_gamma`` broadcast to ``q.shape[:-1]``.
  """
  checks.check_rank("q", q, len(lead_layout.split(",")) + 1,
                    lead_layout[:-1] + ", K]")
  lead = tuple(q.shape[:-1])
  if g is not None and g_gamma is not None:
    raise ValueError(f"give g or g_gamma, not both (g {checks.shape_of(g)}, "
                     f"g_gamma {checks.shape_of(g_gamma)})")
  if g is not None:
    checks.check_shape("g", g, lead, lead_layout)
    return g
  if g_gamma is None:
    return None
  checks.check_float("g_gamma", g_gamma)
  checks.check_shape("g_gamma", g_gamma, lead[-1:], "[H]")
  return jnp.broadcast_to(jnp.asarray(g_gamma, jnp.float32), lead)


def _to_core(step, q, k, v, g, g_gamma):
  return q, k, v, scalar_decay(q, g, g_gamma, "[B, H]" if step else "[B, T, H]")


SIMPLE_GLA = Variant(name="simple_gla",
                     params=("q", "k", "v", ("g", None), ("g_gamma", None)),
                     core_arity=4, to_core=_to_core,
                     step_keywords=("g_gamma",))
