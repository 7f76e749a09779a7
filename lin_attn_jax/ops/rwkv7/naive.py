"""The definition of RWKV-7 (Goose), one token at a time.

In RWKV-7's own orientation (state ``[V, K]``) the update is
``S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T``. In this
package's orientation (state ``[K, V]``, the transpose):

    S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T
    o_t = S_t^T (scale * r_t)

a diagonal-plus-rank-one transition (the generalised delta rule: with
``a = -kappa`` and ``b = kappa * eta`` for a unit key ``kappa`` it removes
what the state holds along ``kappa``). ``w`` is a natural-log decay per key
channel. At a document boundary ``S_{t-1}`` is replaced by 0. RWKV models use
``scale=1.0``; ``None`` means ``K ** -0.5`` as everywhere in this package.

Peng et al., "RWKV-7 "Goose" with Expressive Dynamic State Evolution"
(https://arxiv.org/abs/2503.14456).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import scan_tokens
from lin_attn_jax.ops.rwkv7.inputs import default_scale, validate

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_rwkv7(r, w, k, v, a, b, *, scale=None,
                          initial_state=None, output_final_state=False,
                          segment_ids=None):
  """Reference recurrence. Shapes as in ``chunk_rwkv7``."""
  bs, t, h, dk, dv = validate(r, w, k, v, a, b, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  state = (jnp.zeros((bs, h, dk, dv), jnp.float32) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))

  def step(state, inputs):
    r_t, w_t, k_t, v_t, a_t, b_t = inputs              # [B, H, *]
    read = jnp.einsum("bhk,bhkv->bhv", a_t, state, precision=_HIGHEST)
    state = (jnp.exp(w_t)[..., None] * state
             + b_t[..., :, None] * read[..., None, :]
             + k_t[..., :, None] * v_t[..., None, :])        # [B, H, K, V]
    o_t = jnp.einsum("bhk,bhkv->bhv", scale * r_t, state, precision=_HIGHEST)
    return state, o_t

  o, state = scan_tokens(step, (r, w, k, v, a, b), state, segment_ids)
  return o.astype(v.dtype), (state if output_final_state else None)
