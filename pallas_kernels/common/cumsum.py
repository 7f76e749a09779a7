"""Cumulative sums of log-decays that keep every difference exact.

A float32 prefix sum ``P`` loses the low digits of each term once ``|P|`` is
large: ``P_i - P_j`` after strong gates keeps only a few significant digits
of a sum of weak ones. ``chunk_cumsum`` returns ``P`` as a double-float
``hi + lo`` (``hi`` the float32 sum, ``lo`` the rounding error it carries),
so that ``(hi_i - hi_j) + (lo_i - lo_j)`` is accurate to float32 relative to
the difference itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def _two_sum(a, b):
  """``a + b = s + e`` exactly (Knuth), ``s = fl(a + b)``."""
  s = a + b
  b_part = s - a
  return s, (a - (s - b_part)) + (b - b_part)


def _add(x, y):
  """Double-float addition of ``(hi, lo)`` pairs, renormalised."""
  s, e = _two_sum(x[0], y[0])
  e = e + (x[1] + y[1])
  hi = s + e
  return hi, e - (hi - s)


def chunk_cumsum(g, chunk: int, axis: int = 1):
  """Inclusive prefix sums of ``g`` (float32) restarting every ``chunk``
  elements along ``axis`` (whose length is a multiple of ``chunk``), as
  ``(hi, lo)`` arrays of ``g``'s shape."""
  g = jnp.asarray(g, _F32)
  shape = g.shape
  n = shape[axis] // chunk
  x = g.reshape(shape[:axis] + (n, chunk) + shape[axis + 1:])
  hi, lo = jax.lax.associative_scan(_add, (x, jnp.zeros_like(x)),
                                    axis=axis + 1)
  return hi.reshape(shape), lo.reshape(shape)
