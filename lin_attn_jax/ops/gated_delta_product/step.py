"""One decoding step of Gated DeltaProduct: ``N`` steps of the delta-rule
core's ``delta_rule_step``."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.delta_rule.inputs import l2_normalize
from lin_attn_jax.ops.delta_rule.step import delta_rule_step
from lin_attn_jax.ops.gated_delta_product.inputs import validate


def gated_delta_product_step(q, k, v, g, beta, state=None, *, scale=None,
                             reset=None, use_qk_l2norm=False):
  """One token, O(1) in the context length.

  Sub-step ``j`` is ``delta_rule_step`` on ``(k[:, j], v[:, j], beta[:,
  j])``, the first with the decay ``g`` and ``reset``; the output is the
  last sub-step's read of ``q``.

  Args:
    q: ``[B, H, K]``; k: ``[B, N, H, K]``; v: ``[B, N, HV, V]``; g: ``[B,
      HV]`` or None; beta: ``[B, N, HV]``.
    state: ``[B, HV, K, V]`` float32, or None for zeros.
    scale, use_qk_l2norm: as in ``naive_recurrent_gated_delta_product``.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(o [B, HV, V] in v's dtype, new state [B, HV, K, V] float32)``.
  """
  (b,), n, h, hv, dk, dv = validate(q, k, v, g, beta, state, step=True,
                                    state_name="state")
  checks.check_reset(reset, b)
  if use_qk_l2norm:
    q, k = l2_normalize(q), l2_normalize(k)
  if state is None:
    state = jnp.zeros((b, hv, dk, dv), jnp.float32)
  for j in range(n):
    o, state = delta_rule_step(
        q, k[:, j], v[:, j], beta[:, j], g if j == 0 else None, state,
        scale=scale, reset=reset if j == 0 else None)
  return o, state
