"""Linformer: the definition, grouped heads, and the refusal of causal use."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.ops import linformer_attn, linformer_attn_step
from lin_attn_jax.testing import rel_rms


def linformer_definition(q, k, v, e, f, scale):
  """float64 numpy, one head at a time."""
  q, k, v, e, f = (np.asarray(x, np.float64) for x in (q, k, v, e, f))
  b, t, h, _ = q.shape
  group = h // k.shape[2]
  o = np.zeros((b, t, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      kp = e @ k[bi, :, hi // group]                  # [P, K]
      vp = f @ v[bi, :, hi // group]                  # [P, V]
      s = scale * q[bi, :, hi] @ kp.T                 # [T, P]
      p = np.exp(s - s.max(-1, keepdims=True))
      o[bi, :, hi] = (p / p.sum(-1, keepdims=True)) @ vp
  return o


def test_matches_definition():
  h, hkv = 4, 2
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  q = jax.random.normal(keys[0], (2, 50, h, 8))
  k = jax.random.normal(keys[1], (2, 50, hkv, 8))
  v = jax.random.normal(keys[2], (2, 50, hkv, 12))
  e = jax.random.normal(keys[3], (16, 50)) / 50 ** 0.5
  f = jax.random.normal(keys[4], (16, 50)) / 50 ** 0.5
  o = jax.jit(linformer_attn)(q, k, v, e, f)
  assert o.shape == (2, 50, h, 12)
  assert rel_rms(o, linformer_definition(q, k, v, e, f, 8 ** -0.5)) <= 1e-5
  grads = jax.jit(jax.grad(
      lambda q: jnp.sum(linformer_attn(q, k, v, e, f) ** 2)))(q)
  eps = 1e-3
  dq = np.zeros(q.shape)
  dq[0, 3, 1, 2] = eps
  num = (np.sum(linformer_definition(q + dq, k, v, e, f, 8 ** -0.5) ** 2)
         - np.sum(linformer_definition(q - dq, k, v, e, f, 8 ** -0.5) ** 2))
  np.testing.assert_allclose(grads[0, 3, 1, 2], num / (2 * eps), rtol=1e-3)


def test_every_output_depends_on_the_future():
  """Why there is no causal form: o_0 changes when the last token does."""
  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  q = k = v = jax.random.normal(keys[0], (1, 20, 2, 8))
  e = f = jax.random.normal(keys[1], (4, 20))
  later = v.at[:, -1].add(1.0)
  attend = jax.jit(linformer_attn)
  o, o_later = attend(q, k, v, e, f), attend(q, k, later, e, f)
  assert float(jnp.max(jnp.abs(o[:, 0] - o_later[:, 0]))) > 1e-3


def test_refuses_causal_and_cache():
  q = k = v = jnp.ones((1, 20, 2, 8))
  e = f = jnp.ones((4, 20))
  with pytest.raises(ValueError, match="no causal form.*future"):
    linformer_attn(q, k, v, e, f, causal=True)
  with pytest.raises(ValueError, match="no decoding step or KV cache"):
    linformer_attn_step(q[:, 0], k[:, 0], v[:, 0])


def test_bad_input():
  q = k = v = jnp.ones((1, 20, 2, 8))
  with pytest.raises(ValueError, match=r"e must have shape \[P, T\].*20"):
    linformer_attn(q, k, v, jnp.ones((4, 19)), jnp.ones((4, 19)))
  with pytest.raises(ValueError, match="e and f"):
    linformer_attn(q, k, v, jnp.ones((4, 20)), jnp.ones((5, 20)))
  with pytest.raises(ValueError, match="multiple"):
    linformer_attn(jnp.ones((1, 20, 3, 8)), k, v, jnp.ones((4, 20)),
                   jnp.ones((4, 20)))
