"""The encoder-only ops against transcriptions of their papers' equations
(and their reference code): Agent Attention, Nystromformer and EfficientViT's
ReLU linear attention. Outputs against float64 NumPy, gradients (random
cotangents) against the same transcription in ``jnp``; the refusal of packed
documents, of causal use and of a ``sequence`` axis. The chunk form of the
ReLU attention against its dense form, in bfloat16 and over 8 devices, is in
test_noncausal.py (the registry's non-causal specs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops
from lin_attn_jax.ops.common.pooling import (mean_pool_matrix,
                                             same_depthwise_conv)
from lin_attn_jax.testing import rel_rms

B, T, H, K, V = 2, 24, 2, 8, 6


def _normal(seed, shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def _softmax(xp, s):
  e = xp.exp(s - s.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _heads_first(xp, x):
  return xp.transpose(x, (0, 2, 1, 3))                          # [B, H, T, K]


def agent_definition(xp, q, k, v, an_bias, na_bias, n):
  """The reference ``AgentAttention.forward`` on a sequence: agents by
  average pooling (``T / n`` tokens each), then the two softmaxes."""
  q, k, v = (_heads_first(xp, x) for x in (q, k, v))
  b, h, t, d = q.shape
  scale = d ** -0.5
  agents = q.reshape(b, h, n, t // n, d).mean(3)                # [B, H, N, K]
  agent_attn = _softmax(xp, (agents * scale) @ xp.swapaxes(k, -1, -2)
                        + an_bias)                              # [B, H, N, T]
  agent_v = agent_attn @ v                                      # [B, H, N, V]
  q_attn = _softmax(xp, (q * scale) @ xp.swapaxes(agents, -1, -2)
                    + na_bias)                                  # [B, H, T, N]
  return xp.transpose(q_attn @ agent_v, (0, 2, 1, 3))


def iterative_inv(xp, mat, n_iter, init):
  """The reference ``NystromAttention.iterative_inv``."""
  eye = xp.eye(mat.shape[-1])
  if init == "original":
    z = 1 / xp.max(xp.sum(mat, axis=-2)) * xp.swapaxes(mat, -1, -2)
  else:
    z = (1 / xp.max(xp.sum(mat, axis=-2), axis=-1)[:, :, None, None]
         * xp.swapaxes(mat, -1, -2))
  for _ in range(n_iter):
    kv = mat @ z
    z = (0.25 * z) @ (13 * eye - kv @ (15 * eye - kv @ (7 * eye - kv)))
  return z


def nystrom_definition(xp, q, k, v, m, n_iter=6, init="per_matrix"):
  """The reference ``NystromAttention.forward`` (no mask, no conv)."""
  q, k, v = (_heads_first(xp, x) for x in (q, k, v))
  b, h, t, d = q.shape
  q, k = q / d ** 0.25, k / d ** 0.25
  if m == t:
    return xp.transpose(_softmax(xp, q @ xp.swapaxes(k, -1, -2)) @ v,
                        (0, 2, 1, 3))
  q_l = q.reshape(b, h, m, t // m, d).mean(-2)
  k_l = k.reshape(b, h, m, t // m, d).mean(-2)
  kernel_1 = _softmax(xp, q @ xp.swapaxes(k_l, -1, -2))
  kernel_2 = _softmax(xp, q_l @ xp.swapaxes(k_l, -1, -2))
  kernel_3 = _softmax(xp, q_l @ xp.swapaxes(k, -1, -2))
  x = kernel_1 @ (iterative_inv(xp, kernel_2, n_iter, init) @ (kernel_3 @ v))
  return xp.transpose(x, (0, 2, 1, 3))


def relu_definition(xp, q, k, v, eps=1e-15):
  """The reference ``LiteMLA.relu_linear_att`` (channels first, values
  padded with a row of ones)."""
  q, k = xp.maximum(q, 0), xp.maximum(k, 0)
  q, k, v = (xp.transpose(x, (0, 2, 3, 1)) for x in (q, k, v))  # [B, H, C, T]
  ones = xp.ones_like(v[:, :, :1])
  v = xp.concatenate([v, ones], axis=2)                         # [B,H,V+1,T]
  vk = v @ xp.swapaxes(k, -1, -2)                               # [B,H,V+1,K]
  out = vk @ q                                                  # [B,H,V+1,T]
  out = out[:, :, :-1] / (out[:, :, -1:] + eps)
  return xp.transpose(out, (0, 3, 1, 2))                        # [B,T,H,V]


def relu_by_documents(xp, q, k, v, ids):
  """``relu_definition`` on each document of each row alone."""
  rows = []
  for r in range(q.shape[0]):
    row, starts = [], [0] + [t for t in range(1, q.shape[1])
                             if ids[r][t] != ids[r][t - 1]] + [q.shape[1]]
    for lo, hi in zip(starts[:-1], starts[1:]):
      row.append(relu_definition(xp, q[r:r + 1, lo:hi], k[r:r + 1, lo:hi],
                                 v[r:r + 1, lo:hi]))
    rows.append(xp.concatenate(row, axis=1))
  return xp.concatenate(rows, axis=0)


def _f64(*xs):
  return [np.asarray(x, np.float64) for x in xs]


def _check_grads(op, definition, inputs, tol):
  """Gradients of ``sum(op(**inputs) * c)`` against the definition's, every
  input, a random cotangent ``c``."""
  out = op(**inputs)
  c = _normal(99, out.shape)
  grad = jax.jit(jax.grad(lambda x: jnp.sum(op(**x) * c)))(inputs)
  want = jax.jit(jax.grad(lambda x: jnp.sum(definition(**x) * c)))(inputs)
  for name in inputs:
    assert rel_rms(grad[name], want[name]) <= tol, name


def _qkv(seed=0, t=T):
  return dict(q=_normal(seed, (B, t, H, K)), k=_normal(seed + 1, (B, t, H, K)),
              v=_normal(seed + 2, (B, t, H, V)))


def test_agent_attention_matches_the_reference():
  n = 6
  inputs = dict(_qkv(), agent_bias=_normal(5, (H, n, T)),
                query_bias=_normal(6, (H, T, n)))
  op = jax.jit(lambda **x: ops.agent_attn(**x, agent_num=n))
  want = agent_definition(np, *_f64(*inputs.values()), n)
  assert rel_rms(op(**inputs), want) <= 1e-5
  _check_grads(op, lambda q, k, v, agent_bias, query_bias: agent_definition(
      jnp, q, k, v, agent_bias, query_bias, n), inputs, 1e-5)
  plain = ops.agent_attn(**_qkv(), agent_num=n)
  zero = agent_definition(np, *_f64(*_qkv().values()), 0.0, 0.0, n)
  assert rel_rms(plain, zero) <= 1e-5


def test_agent_pool_uneven_segments():
  """``T = 10`` into 4 agents: PyTorch's adaptive pool, overlapping
  windows [0, 3), [2, 5), [5, 8), [7, 10)."""
  x = _qkv(t=10)
  pool = np.asarray(mean_pool_matrix(10, 4))
  windows = [(0, 3), (2, 5), (5, 8), (7, 10)]
  want = np.zeros((4, 10))
  for i, (lo, hi) in enumerate(windows):
    want[i, lo:hi] = 1 / (hi - lo)
  np.testing.assert_allclose(pool, want, rtol=1e-6)
  assert ops.agent_attn(**x, agent_num=4).shape == (B, 10, H, V)


# The reference code's batch-wide start of the iteration in the slow suite.
@pytest.mark.parametrize("init", ["per_matrix", pytest.param(
    "original", marks=pytest.mark.slow)])
def test_nystromformer_matches_the_reference(init):
  m = 6
  inputs = _qkv(10)
  op = jax.jit(lambda **x: ops.nystrom_attn(**x, num_landmarks=m,
                                            pinv_init=init))
  want = nystrom_definition(np, *_f64(*inputs.values()), m, init=init)
  assert rel_rms(op(**inputs), want) <= 1e-5
  _check_grads(op, lambda q, k, v: nystrom_definition(jnp, q, k, v, m,
                                                      init=init),
               inputs, 1e-4)


def test_nystromformer_with_every_token_a_landmark_is_softmax_attention():
  inputs = _qkv(20)
  exact = np.asarray(ops.parallel_softmax_attn(**inputs, causal=False))
  for m in (T, 2 * T):
    np.testing.assert_allclose(ops.nystrom_attn(**inputs, num_landmarks=m),
                               exact, rtol=1e-5, atol=1e-5)
  want = nystrom_definition(np, *_f64(*inputs.values()), T)
  assert rel_rms(exact, want) <= 1e-5


def test_iterative_pinv_converges_to_the_pseudo_inverse():
  """The iteration converges (third order) to ``np.linalg.pinv``: in 30
  steps for random softmax matrices, in the paper's 6 for diagonally
  dominant ones (landmarks that mostly attend to themselves)."""
  logits = _normal(3, (2, 2, 8, 8))
  for dominance, steps in ((0.0, 30), (4.0, 6)):
    a = jax.nn.softmax(logits + dominance * jnp.eye(8), axis=-1)
    pinv = np.linalg.pinv(np.asarray(a, np.float64))
    assert rel_rms(ops.iterative_pinv(a, iterations=steps), pinv) <= 1e-4
  assert rel_rms(ops.iterative_pinv(a, iterations=2), pinv) >= 0.1


def test_relu_linear_attention_matches_the_reference():
  """The dense form against the reference code, document by document,
  outputs and gradients, float32 and bfloat16; the chunk form's outputs
  too (its gradients, bfloat16 and split against the dense form's in
  test_noncausal.py)."""
  inputs = _qkv(20)
  ids = np.array([[0] * 9 + [1] * 15, [3] * T])
  want = relu_by_documents(np, *_f64(*inputs.values()), ids)
  dense = jax.jit(lambda **x: ops.relu_linear_attn_reference(
      **x, segment_ids=ids))
  assert rel_rms(dense(**inputs), want) <= 1e-5
  _check_grads(dense, lambda q, k, v: relu_by_documents(jnp, q, k, v, ids),
               inputs, 1e-5)
  chunk = jax.jit(lambda **x: ops.chunk_relu_linear_attn(
      **x, segment_ids=ids, chunk_size=8))
  assert rel_rms(chunk(**inputs), want) <= 1e-5
  bf16 = {n: x.astype(jnp.bfloat16) for n, x in inputs.items()}
  o = dense(**bf16)
  assert o.dtype == jnp.bfloat16
  assert rel_rms(o, relu_by_documents(np, *_f64(*bf16.values()), ids)) <= 1e-2


@pytest.mark.parametrize("op", [
    lambda **x: ops.agent_attn(**x, agent_num=4),
    lambda **x: ops.nystrom_attn(**x, num_landmarks=4)],
    ids=["agent_attn", "nystrom_attn"])
def test_one_document_per_row(op):
  inputs = _qkv(30)
  one = jnp.full((B, T), 3)
  np.testing.assert_allclose(op(**inputs, segment_ids=one), op(**inputs),
                             rtol=1e-6)
  two = np.array([[0] * 12 + [1] * 12, [0] * T])
  with pytest.raises(ValueError, match="one document per row"):
    op(**inputs, segment_ids=two)
  traced = jax.jit(lambda ids: op(**inputs, segment_ids=ids))(two)
  assert np.isnan(traced[0]).all() and not np.isnan(traced[1]).any()


def test_causal_use_and_a_sequence_axis_are_refused():
  x = _qkv(40)
  with pytest.raises(ValueError, match="Agent Attention has no causal"):
    ops.agent_attn(**x, agent_num=4, causal=True)
  with pytest.raises(ValueError, match="Nystromformer has no causal"):
    ops.nystrom_attn(**x, causal=True)
  with pytest.raises(ValueError, match="non-causal attention"):
    ops.chunk_relu_linear_attn(**x, causal=True)
  mesh = jax.make_mesh((4, 2), ("data", "sequence"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with jax.set_mesh(mesh):
    with pytest.raises(ValueError, match="Agent Attention cannot split"):
      ops.agent_attn(**x, agent_num=4)
    with pytest.raises(ValueError, match="Nystromformer cannot split"):
      ops.nystrom_attn(**x)


def test_bad_shapes_name_the_argument():
  x = _qkv(50)
  with pytest.raises(ValueError, match="agent_bias"):
    ops.agent_attn(**x, agent_num=4, agent_bias=jnp.ones((H, 4, T + 1)))
  with pytest.raises(ValueError, match="num_landmarks"):
    ops.nystrom_attn(**x, num_landmarks=0)
  with pytest.raises(ValueError, match="segment_ids"):
    ops.chunk_relu_linear_attn(**x, segment_ids=jnp.zeros((B, T + 1)))


def test_same_depthwise_conv_reads_its_document_only():
  x = np.asarray(_normal(60, (2, 11, 3)), np.float64)
  w = np.asarray(_normal(61, (3, 5)), np.float64)
  ids = np.array([[0] * 4 + [1] * 7, [2] * 11])
  want = np.zeros_like(x)
  for r in range(2):
    for t in range(11):
      for j in range(5):
        s = t + j - 2
        if 0 <= s < 11 and ids[r, s] == ids[r, t]:
          want[r, t] += w[:, j] * x[r, s]
  got = same_depthwise_conv(jnp.asarray(x, jnp.float32),
                            jnp.asarray(w, jnp.float32), segment_ids=ids)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="W odd"):
    same_depthwise_conv(x, w[:, :4])
