"""The definition of Gated DeltaProduct, one token at a time.

    S'_t     = exp(g_t) S_{t-1}                           decay (g <= 0)
    S_{t,j}  = S_{t,j-1} + beta_{t,j} k_{t,j} (v_{t,j} - S_{t,j-1}^T k_{t,j})^T
               for j = 1..N, from S_{t,0} = S'_t            N Householder steps
    S_t      = S_{t,N}
    o_t      = S_t^T (scale * q_t)                         S: [K, V] per head

so that ``S_t = (prod_j (I - beta_{t,j} k_{t,j} k_{t,j}^T)) exp(g_t) S_{t-1}
+ ...``: a product of ``N`` generalised Householder transitions per token.
At a document boundary ``S_{t-1}`` is replaced by 0. This is fla's
``naive_recurrent_gated_delta_product`` (``fla/ops/gated_delta_product/
naive.py``), written independently of the delta-rule core; every other form
is tested against it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.delta_rule.inputs import default_scale, expand_query_key
from lin_attn_jax.ops.gated_delta_product.inputs import validate

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_gated_delta_product(q, k, v, g, beta, *, scale=None,
                                        initial_state=None,
                                        output_final_state=False,
                                        segment_ids=None,
                                        use_qk_l2norm=False):
  """Reference recurrence.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, N, H, K]``, ``N`` keys per token (the
      Householder steps); v: ``[B, T, N, HV, V]`` (``HV`` a multiple of
      ``H``; value head ``i`` reads query/key head ``i // (HV / H)``).
    g: ``[B, T, HV]`` log-decay ``<= 0`` applied before the token's steps,
      or None (DeltaProduct without a forget gate).
    beta: ``[B, T, N, HV]`` step sizes (in (0, 2) for a stable state).
    scale: query scale, ``K ** -0.5`` when None.
    initial_state: ``[B, HV, K, V]`` or None (zeros).
    output_final_state: also return the final state.
    segment_ids: ``[B, T]`` int, packed documents.
    use_qk_l2norm: L2-normalise q and every key first.
  Returns:
    ``(o [B, T, HV, V] in v's dtype, final state [B, HV, K, V] float32 or
    None)``.
  """
  (b, t), n, h, hv, dk, dv = validate(q, k, v, g, beta, initial_state,
                                      segment_ids)
  scale = default_scale(scale, dk)
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)   # [B,T,HV,K], [B,T,N,HV,K]
  g = (jnp.zeros((b, t, hv), jnp.float32) if g is None
       else jnp.asarray(g, jnp.float32))
  state = (jnp.zeros((b, hv, dk, dv), jnp.float32) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  reset = reset_flags(segment_ids, b, t)

  def token(state, inputs):
    q_t, k_t, v_t, beta_t, g_t, reset_t = inputs   # k_t [B, N, HV, K]
    state = jnp.where(reset_t[:, None, None, None], 0.0, state)
    state = jnp.exp(g_t)[..., None, None] * state          # [B, HV, K, V]
    for j in range(n):
      k_j = k_t[:, j]                                       # [B, HV, K]
      predicted = jnp.einsum("bhk,bhkv->bhv", k_j, state, precision=_HIGHEST)
      delta = beta_t[:, j, :, None] * (v_t[:, j] - predicted)   # [B, HV, V]
      state = state + k_j[..., :, None] * delta[..., None, :]
    o_t = jnp.einsum("bhk,bhkv->bhv", scale * q_t, state, precision=_HIGHEST)
    return state, o_t

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0)
                for x in (q, k, v, beta, g)]
  state, o = jax.lax.scan(token, state, (*time_major, reset.T))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)                 # [B, T, HV, V]
  return o, (state if output_final_state else None)
