"""Linear attention's arguments on the gated-linear core: no decay, and with
``normalize=True`` one extra all-ones value column whose output is the
denominator ``q_t . sum_{j<=t} k_j``."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.variant import Variant

NORMALIZER_EPS = 1e-6


def with_normalizer(v):
  """Appends the all-ones value column that accumulates ``q . sum k``."""
  vf = jnp.asarray(v, jnp.float32)
  return jnp.concatenate([vf, jnp.ones_like(vf[..., :1])], axis=-1)


def divide(o_aug, dtype, eps=NORMALIZER_EPS):
  """``o = num / (den + eps)``: the last column of ``o_aug`` is ``den``."""
  o = o_aug[..., :-1] / (o_aug[..., -1:] + eps)
  return o.astype(dtype)


def _to_core(step, q, k, v, normalize):
  del step
  return q, k, with_normalizer(v) if normalize else v, None


def _from_core(outputs, q, k, v, normalize):
  del q, k
  if not normalize:
    return outputs
  o, state = outputs
  return divide(o, v.dtype), state


LINEAR_ATTN = Variant(name="linear_attn", params=("q", "k", "v"),
                      core_arity=4, to_core=_to_core,
                      keywords=(("normalize", False),), from_core=_from_core)
