"""The definition of MesaNet's recurrence, one token at a time.

    H^kk_t = exp(g_t) H^kk_{t-1} + beta_t k_t k_t^T      [K, K] per head
    H^kv_t = exp(g_t) H^kv_{t-1} + beta_t k_t v_t^T      [K, V] per head
    x_t    = (H^kk_t + diag(lamb))^{-1} q_t              (CG, ``cg.py``)
    o_t    = H^kv_t^T x_t

``g_t`` is a natural-log decay per head and token, ``beta_t`` a writing
strength, ``lamb [H, K]`` the regulariser per key channel (> 0). At a
document boundary (``segment_ids`` changes) both states are replaced by 0.
Everything here is float32 and written for reading; every other form is
tested against it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.mesa_net.cg import dense_matvec, solve
from lin_attn_jax.ops.mesa_net.inputs import (CG_STEPS, pack_mesa_net_state,
                                              query_key,
                                              unpack_mesa_net_state,
                                              validate, zero_state)

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_mesa_net(q, k, v, g, beta, lamb, *, initial_state=None,
                             output_final_state=False, segment_ids=None,
                             cg_steps=CG_STEPS, use_qk_l2norm=False):
  """MesaNet (von Oswald et al. 2025, https://arxiv.org/abs/2506.05233),
  token by token.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: ``[B, T, H]`` natural-log decays ``<= 0``.
    beta: ``[B, T, H]`` writing strengths (the reference's sigmoid outputs).
    lamb: ``[H, K]`` regulariser ``> 0`` (the reference's ``softplus(.) +
      0.25``).
    initial_state: ``[B, H, K, K + V]`` float32 ``[H^kk | H^kv]``
      (``pack_mesa_net_state``; ``H^kk`` symmetric), or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int; both states reset where the id changes.
    cg_steps: conjugate-gradient steps per token (the reference's 30).
    use_qk_l2norm: L2-normalise q and k over K first (what the reference's
      layer does).
  Returns:
    ``(o [B, T, H, V] in v's dtype, final state [B, H, K, K + V] float32
    or None)``.

  Gradients: implicit through the solve (``cg.py``), as the reference's.
  """
  b, t, h, dk, dv = validate(q, k, v, g, beta, lamb, initial_state,
                             segment_ids, cg_steps)
  q, k = query_key(q, k, use_qk_l2norm)
  lamb = jnp.asarray(lamb, _F32)
  h_kk, h_kv = unpack_mesa_net_state(
      zero_state(b, h, dk, dv) if initial_state is None else initial_state)
  reset = reset_flags(segment_ids, b, t)

  def token(states, inputs):
    h_kk, h_kv = states
    q_t, k_t, v_t, g_t, beta_t, reset_t = inputs        # [B, H, *], [B]
    keep = jnp.where(reset_t, 0.0, 1.0)[:, None, None, None]
    decay = jnp.exp(g_t)[..., None, None] * keep         # [B, H, 1, 1]
    k_beta = beta_t[..., None] * k_t                     # [B, H, K]
    h_kk = decay * h_kk + k_beta[..., :, None] * k_t[..., None, :]
    h_kv = decay * h_kv + k_beta[..., :, None] * v_t[..., None, :]
    x_t = solve(dense_matvec(h_kk, lamb), q_t, cg_steps)  # [B, H, K]
    o_t = jnp.einsum("bhk,bhkv->bhv", x_t, h_kv, precision=_HIGHEST)
    return (h_kk, h_kv), o_t

  time_major = [jnp.moveaxis(jnp.asarray(x, _F32), 1, 0)
                for x in (q, k, v, g, beta)]
  (h_kk, h_kv), o = jax.lax.scan(token, (h_kk, h_kv), (*time_major, reset.T))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)               # [B, T, H, V]
  return o, (pack_mesa_net_state(h_kk, h_kv) if output_final_state else None)
