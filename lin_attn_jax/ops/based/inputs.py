"""Based's arguments on linear attention: the second-order Taylor features of
q and k, normalized, with the Taylor scale in place of the query scale."""

from __future__ import annotations

from lin_attn_jax import feature_maps
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.variant import Variant


def based_features(q, k, scale=None):
  """Taylor features of q and k (``[..., K] -> [..., 1 + K + K^2]``)."""
  checks.check_float("q", q)
  checks.check_float("k", k)
  return feature_maps.taylor(q, scale), feature_maps.taylor(k, scale)


def _to_core(step, q, k, v, scale):
  del step
  return (*based_features(q, k, scale), v)


BASED = Variant(name="based", params=("q", "k", "v"), core_arity=3,
                to_core=_to_core, keywords=(("scale", None),),
                fixed=(("scale", 1.0), ("normalize", True),
                       ("causal", True)))
