"""The definition of Gated DeltaNet-2, one token at a time.

    S'_t = diag(exp(g_t)) S_{t-1}                        decay per key channel
    S_t  = S'_t + k_t (w_t * v_t - S'_t^T (b_t * k_t))^T  erase, then write
         = (I - k_t (b_t * k_t)^T) diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T
    o_t  = S_t^T (scale * q_t)                           S: [K, V] per head

``b_t [K]`` is the erase gate on the key channels and ``w_t [V]`` the write
gate on the value channels; ``b = w = beta`` (a scalar) is KDA. At a
document boundary ``S_{t-1}`` is replaced by 0. float32, written for
reading; every other form is tested against it, and it against
flash-linear-attention's ``ops/gdn2/naive.py``
(``tests/fixtures/ops/gdn2.npz``).

Gated DeltaNet-2, "Decoupling Erase and Write in Linear Attention"
(NVlabs/GatedDeltaNet-2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import scan_tokens
from lin_attn_jax.ops.gdn2.inputs import (default_scale, expand_query_key,
                                          validate)

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_gdn2(q, k, v, g, b, w, *, scale=None, initial_state=None,
                         output_final_state=False, segment_ids=None,
                         use_qk_l2norm=False):
  """Reference recurrence. Shapes as in ``chunk_gdn2``."""
  bs, t, h, hv, dk, dv = validate(q, k, v, g, b, w, initial_state,
                                  segment_ids)
  scale = default_scale(scale, dk)
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)            # [B, T, HV, K]
  state = (jnp.zeros((bs, hv, dk, dv), jnp.float32) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))

  def step(state, inputs):
    q_t, k_t, v_t, g_t, b_t, w_t = inputs              # [B, HV, *]
    state = jnp.exp(g_t)[..., None] * state                 # [B, HV, K, V]
    erased = jnp.einsum("bhk,bhkv->bhv", b_t * k_t, state,
                        precision=_HIGHEST)                 # [B, HV, V]
    state = state + k_t[..., :, None] * (w_t * v_t - erased)[..., None, :]
    o_t = jnp.einsum("bhk,bhkv->bhv", scale * q_t, state, precision=_HIGHEST)
    return state, o_t

  o, state = scan_tokens(step, (q, k, v, g, b, w), state, segment_ids)
  return o.astype(v.dtype), (state if output_final_state else None)
