"""The definition of Comba, one token at a time.

    read_t = S_{t-1}^T p_t                       read along the erase key p
    S_t    = exp(g_t) S_{t-1} + beta_t k_t (v_t - read_t)^T     write along k
           = (exp(g_t) I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t    = S_t^T (scale * q_t)                        S: [K, V] per head

The transition is a scalar plus a rank-one matrix (the paper's "SPLR"):
the state is read before the decay. This is what flash-linear-attention's
Comba kernels (``fused_recurrent_comba``, ``chunk_comba``) and its
``naive_chunk_comba`` compute; its ``naive_recurrent_comba`` reads the
decayed state ``exp(g_t) S_{t-1}`` instead, which is this recurrence with
the erase key ``exp(g_t) p_t`` (README.md). ``p = k`` is not Gated
DeltaNet here: Gated DeltaNet reads after the decay. At a document boundary
``S_{t-1}`` is replaced by 0. float32, written for reading; every other
form is tested against it, and it against both of fla's naive forms
(``tests/fixtures/ops/comba.npz``).

Comba: Hu et al., "Comba: Improving Bilinear RNNs with Closed-loop
Control", https://arxiv.org/abs/2506.02475.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.comba.inputs import (default_scale, expand_erase_key,
                                           validate)
from lin_attn_jax.ops.common.segments import scan_tokens
from lin_attn_jax.ops.delta_rule.inputs import expand_query_key

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_comba(q, k, v, p, g, beta, *, scale=None,
                          initial_state=None, output_final_state=False,
                          segment_ids=None, use_qk_l2norm=False):
  """Reference recurrence. Shapes as in ``chunk_comba``."""
  bs, t, h, hv, dk, dv, g = validate(q, k, v, p, g, beta, initial_state,
                                     segment_ids)
  scale = default_scale(scale, dk)
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)            # [B, T, HV, K]
  p = expand_erase_key(p, hv, use_qk_l2norm)                  # [B, T, HV, K]
  state = (jnp.zeros((bs, hv, dk, dv), jnp.float32) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))

  def step(state, inputs):
    q_t, k_t, v_t, p_t, g_t, beta_t = inputs            # [B, HV, *]
    read = jnp.einsum("bhk,bhkv->bhv", p_t, state,
                      precision=_HIGHEST)                   # [B, HV, V]
    state = jnp.exp(g_t)[..., None] * state + k_t[..., :, None] * (
        beta_t[..., None] * (v_t - read))[..., None, :]     # [B, HV, K, V]
    o_t = jnp.einsum("bhk,bhkv->bhv", scale * q_t, state, precision=_HIGHEST)
    return state, o_t

  o, state = scan_tokens(step, (q, k, v, p, g, beta), state, segment_ids)
  return o.astype(v.dtype), (state if output_final_state else None)
