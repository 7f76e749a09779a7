"""One decoding step: ``m``, then ``gated_linear_step`` on ``[C~ | n~]``."""

from __future__ import annotations

from lin_attn_jax.ops.gated_linear import gated_linear_step
from lin_attn_jax.ops.mlstm.inputs import EPS
from lin_attn_jax.ops.mlstm.on_core import step_on_core


def mlstm_step(q, k, v, i, f, state=None, *, scale=None, eps=EPS, reset=None):
  """One decoding step, O(1) in the context length.

  Args:
    q, k: ``[B, H, K]``; v: ``[B, H, V]``; i, f: ``[B, H]`` gate
      pre-activations (as in ``naive_recurrent_mlstm``).
    state: ``[B, H, K, V + 2]`` float32 ``[C | n | m]``, or None for zeros.
    scale: query scale, ``K ** -0.5`` when None.
    eps: added to the denominator.
    reset: ``[B]`` bool, True where this token starts a new document (the
      state is zeroed first).
  Returns:
    ``(h [B, H, V] in v's dtype, new state [B, H, K, V + 2] float32)``.
  """
  return step_on_core(gated_linear_step, q, k, v, i, f, state, scale=scale,
                      eps=eps, reset=reset)
