"""RetNet's arguments on the gated-linear core: the fixed per-head decay
``g_gamma[h] = log(1 - 2 ** (-5 - h))``."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.variant import Variant
from lin_attn_jax.ops.simple_gla.inputs import scalar_decay


def retention_log_decay(num_heads: int):
  """``[H]`` float32: ``log(1 - 2 ** (-5 - h))`` for ``h = 0 .. H-1``."""
  h = jnp.arange(num_heads, dtype=jnp.float32)
  return jnp.log1p(-jnp.exp2(-5.0 - h))


def _to_core(step, q, k, v):
  heads = q.shape[-2] if getattr(q, "ndim", 0) >= 3 else 0
  layout = "[B, H]" if step else "[B, T, H]"
  return q, k, v, scalar_decay(q, None, retention_log_decay(heads), layout)


RETENTION = Variant(name="retention", params=("q", "k", "v"), core_arity=4,
                    to_core=_to_core)
