"""One decoding step of Mamba-3, O(1) in the context length."""

from __future__ import annotations

from lin_attn_jax.ops.gated_linear import gated_linear_step
from lin_attn_jax.ops.mamba3.on_core import mimo_step_on_core, step_on_core


def mamba3_step(q, k, v, g, dt, trap, angles, state=None, *, reset=None):
  """One token of ``naive_recurrent_mamba3``.

  Args:
    q, k: ``[B, H, K]``; v: ``[B, H, V]``; g, dt, trap: ``[B, H]``;
    angles: ``[B, H, A]``.
    state: ``[B, H, K + 1, V + 2]`` float32, or None for zeros.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(o [B, H, V] in v's dtype, new state [B, H, K + 1, V + 2] float32)``.
  """
  return step_on_core(gated_linear_step, q, k, v, g, dt, trap, angles, state,
                      reset=reset)


def mamba3_mimo_step(q, k, v, g, dt, trap, angles, state=None, *,
                     reset=None):
  """One token of ``naive_recurrent_mamba3_mimo``.

  Args:
    q, k: ``[B, H, R, K]``; v: ``[B, H, R, V]``; g, dt, trap: ``[B, H]``;
    angles: ``[B, H, A]``.
    state: ``[B, H, K + R, V + R]`` float32, or None for zeros.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(o [B, H, R, V] in v's dtype, new state [B, H, K + R, V + R]
    float32)``.
  """
  return mimo_step_on_core(q, k, v, g, dt, trap, angles, state, reset=reset)
