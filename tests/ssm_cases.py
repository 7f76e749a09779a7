"""Shared cases for the diagonal-SSM tests: lengths, packed documents, jit.

A covering set instead of a full product: every length in {1, 63, 64, 200}
appears, and so do runs with and without an initial state and with and
without segment ids. Each case checks every form against one naive run.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# (T, with initial state, with segment ids)
CASES = [(1, True, False), (63, False, True), (64, True, True),
         (200, True, True), (200, False, False)]
CASE_IDS = [f"T{t}-{'h0' if h0 else 'noh0'}-{'seg' if seg else 'noseg'}"
            for t, h0, seg in CASES]


def segment_ids(key, batch: int, length: int, rate: float = 0.06):
  """``[B, T]`` int32 ids that change at random places (ids repeat: 0,1,0,...).

  Every row with ``T >= 3`` has at least one change.
  """
  starts = jax.random.bernoulli(key, rate, (batch, length))
  if length >= 3:
    starts = starts.at[:, length // 2].set(True)
  starts = starts.at[:, 0].set(False)
  return (jnp.cumsum(starts.astype(jnp.int32), axis=1) % 2).astype(jnp.int32)


def jitted(form, **static):
  """``form`` with static keyword options bound, compiled once per shape."""
  return jax.jit(functools.partial(form, **static))


def random_cotangent_loss(o, state, key):
  """A random linear functional of ``(o, state)`` (for gradient checks)."""
  k_o, k_s = jax.random.split(key)
  loss = jnp.sum(o.astype(jnp.float32)
                 * jax.random.normal(k_o, o.shape, jnp.float32))
  if state is not None:
    loss = loss + jnp.sum(state * jax.random.normal(k_s, state.shape,
                                                     state.dtype))
  return loss


def all_finite(tree) -> bool:
  return all(bool(np.all(np.isfinite(np.asarray(x, np.float32))))
             for x in jax.tree_util.tree_leaves(tree))
