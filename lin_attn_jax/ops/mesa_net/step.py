"""One decoding step: the core's state update, then the solve."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.gated_linear import gated_linear_step
from lin_attn_jax.ops.mesa_net.cg import dense_matvec, diagonal_start, solve
from lin_attn_jax.ops.mesa_net.inputs import (CG_STEPS, query_key,
                                              validate_step, zero_state)

_F32 = jnp.float32
CG_STARTS = ("zeros", "diagonal")


def mesa_net_step(q, k, v, g, beta, lamb, state=None, *, reset=None,
                  cg_steps=CG_STEPS, use_qk_l2norm=False, cg_start="zeros"):
  """One decoding step, O(1) in the context length.

  The state ``[H^kk | H^kv]`` is the gated-linear core's state for the key
  ``beta k`` and the value ``[k | v]``: ``gated_linear_step`` updates it
  (its read is not used), then ``x = (H^kk + diag(lamb))^{-1} q`` by CG and
  ``o = H^kv^T x``.

  Args:
    q, k: ``[B, H, K]``; v: ``[B, H, V]``; g, beta: ``[B, H]``;
    lamb: ``[H, K]``: as in ``naive_recurrent_mesa_net``.
    state: ``[B, H, K, K + V]`` float32, or None for zeros.
    reset: ``[B]`` bool, True where this token starts a new document (the
      state is zeroed first).
    cg_steps, use_qk_l2norm: as in ``naive_recurrent_mesa_net``.
    cg_start: ``"zeros"`` (the CG of every sequence form, so that decoding
      continues a prefill exactly) or ``"diagonal"``, the start ``q /
      (diag(H^kk) + lamb + 1e-5)`` of the reference's decoding kernel: the
      reference's CG stops improving at a residual near ``sqrt(1e-5 /
      lamb)`` (its ``1e-5`` guards), so the two starts differ by about
      ``1e-4`` relative in ``o`` for unit queries.
  Returns:
    ``(o [B, H, V] in v's dtype, new state [B, H, K, K + V] float32)``.
  """
  b, h, dk, dv = validate_step(q, k, v, g, beta, lamb, state, reset,
                               cg_steps)
  if cg_start not in CG_STARTS:
    raise ValueError(f"cg_start must be one of {CG_STARTS}, got {cg_start!r}")
  q, k = query_key(q, k, use_qk_l2norm)
  state = zero_state(b, h, dk, dv) if state is None else state
  k_beta = jnp.asarray(beta, _F32)[..., None] * k               # [B, H, K]
  values = jnp.concatenate([k, jnp.asarray(v, _F32)], axis=-1)  # [B, H, K+V]
  _, state = gated_linear_step(jnp.zeros_like(q), k_beta, values,
                               jnp.asarray(g, _F32), state, scale=1.0,
                               reset=reset)
  h_kk, lamb = state[..., :dk], jnp.asarray(lamb, _F32)
  start = diagonal_start(h_kk, lamb) if cg_start == "diagonal" else None
  x = solve(dense_matvec(h_kk, lamb), q, cg_steps, start)       # [B, H, K]
  o = jnp.einsum("bhk,bhkv->bhv", x, state[..., dk:],
                 preferred_element_type=_F32)
  return o.astype(v.dtype), state
