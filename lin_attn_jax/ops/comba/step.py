"""One Comba decoding step, O(1) in the context length: the delta-rule
core's ``erase_write`` with the erase key ``beta * p`` and the written value
``beta * v``."""

from __future__ import annotations

from lin_attn_jax.ops.comba.inputs import (core_inputs, default_scale,
                                           validate_step)
from lin_attn_jax.ops.delta_rule.step import erase_write


def comba_step(q, k, v, p, g, beta, state=None, *, scale=None, reset=None,
               use_qk_l2norm=False):
  """One decoding step, O(1) in the context length.

  Args:
    q, k, p: ``[B, H, K]``; v: ``[B, HV, V]`` (``HV`` a multiple of ``H``).
    g: ``[B, HV]`` log-decay ``<= 0``; beta: ``[B, HV]`` writing strength.
    state: ``[B, HV, K, V]`` float32, or None for zeros.
    scale: query scale, ``K ** -0.5`` when None.
    reset: ``[B]`` bool, True where this token starts a new document.
    use_qk_l2norm: L2-normalise q, k and p first.
  Returns:
    ``(o [B, HV, V] in v's dtype, new state [B, HV, K, V] float32)``.
  """
  _, _, hv, dk, _, g = validate_step(q, k, v, p, g, beta, state, reset)
  scale = default_scale(scale, dk)
  q, k, erase, written, g = core_inputs(q, k, v, p, g, beta, hv,
                                        use_qk_l2norm)
  o, state = erase_write(scale * q, k, erase, written, g, state, reset,
                         read_before_decay=True)
  return o.astype(v.dtype), state
