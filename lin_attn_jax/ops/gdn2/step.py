"""One Gated DeltaNet-2 decoding step, O(1) in the context length."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.gdn2.inputs import (core_inputs, default_scale,
                                          validate_step)

_F32 = jnp.float32


def gdn2_step(q, k, v, g, b, w, state=None, *, scale=None, reset=None,
              use_qk_l2norm=False):
  """One decoding step, O(1) in the context length.

  Args:
    q, k: ``[B, H, K]``; v: ``[B, HV, V]`` (``HV`` a multiple of ``H``).
    g: ``[B, HV, K]`` log-decay ``<= 0``.
    b: ``[B, HV, K]`` erase gate; w: ``[B, HV, V]`` write gate.
    state: ``[B, HV, K, V]`` float32, or None for zeros.
    scale: query scale, ``K ** -0.5`` when None.
    reset: ``[B]`` bool, True where this token starts a new document.
    use_qk_l2norm: L2-normalise q and k first.
  Returns:
    ``(o [B, HV, V] in v's dtype, new state [B, HV, K, V] float32)``.
  """
  bs, _, hv, dk, dv = validate_step(q, k, v, g, b, w, state, reset)
  scale = default_scale(scale, dk)
  q, k, erase, written, g = core_inputs(q, k, v, g, b, w, hv, use_qk_l2norm)
  state = (jnp.zeros((bs, hv, dk, dv), _F32) if state is None
           else jnp.asarray(state, _F32))
  if reset is not None:
    state = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, state)
  state = jnp.exp(g)[..., None] * state                         # [B,HV,K,V]
  erased = jnp.einsum("bhk,bhkv->bhv", erase, state)            # [B, HV, V]
  state = state + k[..., :, None] * (written - erased)[..., None, :]
  o = jnp.einsum("bhk,bhkv->bhv", scale * q, state)             # [B, HV, V]
  return o.astype(v.dtype), state
