"""``intra_chunk_scores``: per-channel decay scores of a chunk, every level
in one batched matmul (chunks) or joined level by level (whole sequences),
against the pairwise definition in float64."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.ops.common import chunk_scores


def _reference(x, y, g, strict):
  """``A[i, j] = sum_k x_ik y_jk exp(sum_{j < m <= i} g_mk)`` (``m < i`` and
  no diagonal when strict), float64."""
  c = x.shape[-2]
  out = np.zeros(x.shape[:-2] + (c, c))
  for i in range(c):
    for j in range(i + 1):
      if strict and j == i:
        continue
      decay = np.exp(np.sum(g[..., j + 1:i + (0 if strict else 1), :],
                            axis=-2))
      out[..., i, j] = np.sum(x[..., i, :] * y[..., j, :] * decay, axis=-1)
  return out


def _inputs(c, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((2, 2, c, 4))
  y = rng.standard_normal((2, 2, c, 4))
  r = rng.standard_normal((2, 2, c, 4))
  # Strong and weak gates: a few tokens decay by e^-8 and more.
  g = -np.exp(rng.standard_normal((2, 2, c, 4)) * 1.5)
  g[0, 0, c // 2, 1] = -np.inf          # a full reset of one channel
  return x, y, r, g


def _scores(x, y, r, g):
  # Two read sides (strict, causal) against two written sides, as RWKV-7.
  rows = chunk_scores.intra_chunk_scores((x, r), (y, x), g,
                                         strict=(True, False))
  return [s for row in rows for s in row]


# 3 is padded to 4; 16 is the largest batched chunk; 17, padded to 32, is
# joined level by level (both halves of the test then check that path).
@pytest.mark.parametrize("c", [3, 16, 17])
def test_batched_levels_match_the_definition_and_the_joined_levels(
    c, monkeypatch):
  x, y, r, g = _inputs(c)
  args = tuple(jnp.asarray(z, jnp.float32) for z in (x, y, r, g))
  expected = [_reference(a, b, g, s)
              for a, s in ((x, True), (r, False)) for b in (y, x)]
  cotangents = [np.random.default_rng(k).standard_normal(e.shape)
                for k, e in enumerate(expected)]

  def loss(*a):
    return sum(jnp.sum(s * ct) for s, ct in zip(_scores(*a), cotangents))

  # Fresh functions for each path: jit would reuse a trace of the same one.
  batched = jax.jit(lambda *a: _scores(*a))(*args)
  batched_grads = jax.jit(jax.grad(lambda *a: loss(*a),
                                   argnums=(0, 1, 2, 3)))(*args)
  for got, want in zip(batched, expected):
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(np.asarray(got), want, rtol=0,
                               atol=2e-6 * scale)

  # The same scores joined level by level: equal values and gradients.
  monkeypatch.setattr(chunk_scores, "MAX_BATCHED_SIZE", 1)
  joined = jax.jit(lambda *a: _scores(*a))(*args)
  joined_grads = jax.jit(jax.grad(lambda *a: loss(*a),
                                  argnums=(0, 1, 2, 3)))(*args)
  for a, b in zip(batched + list(batched_grads), joined + list(joined_grads)):
    scale = np.max(np.abs(np.asarray(b)))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                               atol=2e-6 * scale)


def _raise(*args, **kwargs):
  raise AssertionError("the halving ran where the factored scores apply")


# 16 tokens (the CPU chunk), and 64 at RWKV-7's bound: a span of 38.8, the
# largest factors the factored scores allow.
@pytest.mark.parametrize("c", [16, 64])
def test_factored_scores_match_the_definition_and_the_halving(
    c, monkeypatch):
  floor = -math.exp(-0.5)
  assert chunk_scores.factored_applies(c, floor)
  x, y, r, _ = _inputs(c)
  rng = np.random.default_rng(1)
  # Gates in (floor, 0): near 0 and near the bound.
  g = floor * rng.uniform(0.0, 1.0, x.shape) ** 0.3
  args = tuple(jnp.asarray(z, jnp.float32) for z in (x, y, r, g))
  expected = [_reference(a, b, g, s)
              for a, s in ((x, True), (r, False)) for b in (y, x)]
  cotangents = [rng.standard_normal(e.shape) for e in expected]
  decay_cts = [rng.standard_normal(s) for s in (g.shape, g.shape,
                                                g.shape[:-2] + g.shape[-1:])]

  def run(x, y, r, g, bound):
    rows, decays = chunk_scores.intra_chunk_scores(
        (x, r), (y, x), g, strict=(True, False), with_decays=True,
        min_log_decay=bound)
    return [s for row in rows for s in row], list(decays)

  def loss(bound, *a):
    scores, decays = run(*a, bound)
    return (sum(jnp.sum(s * ct) for s, ct in zip(scores, cotangents))
            + sum(jnp.sum(d * ct) for d, ct in zip(decays, decay_cts)))

  halving = jax.jit(lambda *a: run(*a, None))(*args)
  halving_grads = jax.jit(jax.grad(lambda *a: loss(None, *a),
                                   argnums=(0, 1, 2, 3)))(*args)
  for name in ("_batched_level_scores", "_joined_level_scores",
               "level_log_decays"):
    monkeypatch.setattr(chunk_scores, name, _raise)
  factored = jax.jit(lambda *a: run(*a, floor))(*args)
  factored_grads = jax.jit(jax.grad(lambda *a: loss(floor, *a),
                                    argnums=(0, 1, 2, 3)))(*args)
  for got, want in zip(factored[0], expected):
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(np.asarray(got), want, rtol=0,
                               atol=2e-6 * scale)
  for a, b in zip(factored[1] + list(factored_grads),
                  halving[1] + list(halving_grads)):
    scale = np.max(np.abs(np.asarray(b)))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                               atol=2e-6 * scale)


def test_factored_scores_only_within_their_span():
  assert not chunk_scores.factored_applies(16, None)
  assert chunk_scores.factored_applies(40, -1.0)
  assert not chunk_scores.factored_applies(41, -1.0)
  assert not chunk_scores.factored_applies(128, -math.exp(-0.5))
