"""One Gated DeltaNet-2 decoding step, O(1) in the context length: the
delta-rule core's ``erase_write`` with the erase key ``b * k`` and the
written value ``w * v``."""

from __future__ import annotations

from lin_attn_jax.ops.delta_rule.step import erase_write
from lin_attn_jax.ops.gdn2.inputs import (core_inputs, default_scale,
                                          validate_step)


def gdn2_step(q, k, v, g, b, w, state=None, *, scale=None, reset=None,
              use_qk_l2norm=False):
  """One decoding step, O(1) in the context length.

  Args:
    q, k: ``[B, H, K]``; v: ``[B, HV, V]`` (``HV`` a multiple of ``H``).
    g: ``[B, HV, K]`` log-decay ``<= 0``.
    b: ``[B, HV, K]`` erase gate; w: ``[B, HV, V]`` write gate.
    state: ``[B, HV, K, V]`` float32, or None for zeros.
    scale: query scale, ``K ** -0.5`` when None.
    reset: ``[B]`` bool, True where this token starts a new document.
    use_qk_l2norm: L2-normalise q and k first.
  Returns:
    ``(o [B, HV, V] in v's dtype, new state [B, HV, K, V] float32)``.
  """
  _, _, hv, dk, _ = validate_step(q, k, v, g, b, w, state, reset)
  scale = default_scale(scale, dk)
  q, k, erase, written, g = core_inputs(q, k, v, g, b, w, hv, use_qk_l2norm)
  o, state = erase_write(scale * q, k, erase, written, g, state, reset)
  return o.astype(v.dtype), state
