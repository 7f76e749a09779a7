"""One Mamba-2 SSD decoding step."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.ssd.inputs import add_skip, time_step, validate_step


def ssd_step(x, dt, A, B, C, state=None, *, D=None, dt_bias=None,
             dt_softplus=False, reset=None):
  """One decoding step, O(1) in the context length.

  Heads are viewed as ``[G, R]`` (``R = H / G`` heads per group), so ``B``
  and ``C`` are read per group without being copied to every head.

  Args:
    x: ``[B, H, P]``; dt: ``[B, H]``; A, D, dt_bias: ``[H]``;
    B, C: ``[B, G, N]``.
    state: ``[B, H, N, P]`` float32, or None for zeros.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(y [B, H, P] in x's dtype, new state [B, H, N, P] float32)``.
  """
  batch, n_heads, head_dim, groups, n_state = validate_step(
      x, dt, A, B, C, D, dt_bias, dt_softplus, state, reset)
  per_group = n_heads // groups
  h = initial(state, (batch, n_heads, n_state, head_dim))
  if reset is not None:
    h = jnp.where(jnp.asarray(reset)[:, None, None, None], 0.0, h)
  h = h.reshape(batch, groups, per_group, n_state, head_dim)
  step_size = time_step(dt, dt_bias, dt_softplus)                 # [B, H]
  decay = jnp.exp(step_size * jnp.asarray(A, jnp.float32))
  decay = decay.reshape(batch, groups, per_group, 1, 1)
  v = (step_size[..., None] * jnp.asarray(x, jnp.float32)).reshape(
      batch, groups, per_group, head_dim)                         # [B,G,R,P]
  h = decay * h + jnp.einsum("bgn,bgrp->bgrnp",
                             jnp.asarray(B, jnp.float32), v)
  y = jnp.einsum("bgrnp,bgn->bgrp", h, jnp.asarray(C, jnp.float32))
  y = add_skip(y.reshape(batch, n_heads, head_dim), x, D)
  return (y.astype(x.dtype),
          h.reshape(batch, n_heads, n_state, head_dim))
