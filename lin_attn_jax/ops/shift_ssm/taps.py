"""The shift SSM's taps in time order and its skip term."""

from __future__ import annotations

import jax.numpy as jnp

_F32 = jnp.float32


def skip(y, u, D):
  return y if D is None else y + jnp.asarray(D, _F32) * jnp.asarray(u, _F32)


def taps_oldest_first(C):
  """``C[:, l]`` multiplies ``u_{t-l}``; ``causal_conv1d`` wants the oldest
  tap first."""
  return jnp.flip(jnp.asarray(C, _F32), axis=1)
