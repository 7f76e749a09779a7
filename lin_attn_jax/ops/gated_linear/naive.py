"""The definition of the gated-linear-attention core, one token at a time.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T        S: [K, V] per head
    o_t = S_t^T (scale * q_t)

``g_t`` is a natural-log decay, a scalar per head or one per key channel.
At a document boundary (``segment_ids`` changes) ``S_{t-1}`` is replaced by 0.
With ``causal=False`` the definition is LION's dense ``[T, T]`` form
(``bidirectional.py``): every token reads its whole document, the decays
between the two tokens multiplied in either direction.
Everything here is float32 and written for reading; every other form and
kernel is tested against it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.gated_linear.bidirectional import lion_definition
from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate

_HIGHEST = jax.lax.Precision.HIGHEST


def naive_recurrent_gated_linear(q, k, v, g=None, *, scale=None,
                                 initial_state=None, output_final_state=False,
                                 segment_ids=None, causal=True):
  """Reference recurrence. Shapes as in ``chunk_gated_linear``."""
  b, t, h, dk, dv, g = validate(q, k, v, g, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  check_no_state("naive_recurrent_gated_linear", causal, initial_state,
                 output_final_state)
  if not causal:
    o = lion_definition(q, k, v, g, scale=scale, segment_ids=segment_ids)
    return o.astype(v.dtype), None
  if g is None:
    g = jnp.zeros((b, t, h, 1), jnp.float32)
  state = (jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None
           else jnp.asarray(initial_state, jnp.float32))
  reset = reset_flags(segment_ids, b, t)

  def step(state, inputs):
    q_t, k_t, v_t, g_t, reset_t = inputs                 # [B, H, K], [B]
    state = jnp.where(reset_t[:, None, None, None], 0.0, state)
    state = (jnp.exp(g_t)[..., None] * state
             + k_t[..., :, None] * v_t[..., None, :])     # [B, H, K, V]
    o_t = jnp.einsum("bhk,bhkv->bhv", scale * q_t, state, precision=_HIGHEST)
    return state, o_t

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0)
                for x in (q, k, v, g)]
  state, o = jax.lax.scan(step, state, (*time_major, reset.T))
  o = jnp.moveaxis(o, 0, 1).astype(v.dtype)               # [B, T, H, V]
  return o, (state if output_final_state else None)
