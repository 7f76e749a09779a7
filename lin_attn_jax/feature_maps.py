"""Feature maps ``phi`` for kernelized linear attention.

Linear attention replaces ``exp(q . k)`` by ``phi(q) . phi(k)`` so that the
sum over keys can be carried as a state. Every map acts on the last axis
(``[..., K] -> [..., F]``) and keeps the input dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks


def elu_plus_one(x):
  """``elu(x) + 1``, positive. Katharopoulos et al. 2020, "Transformers are
  RNNs" (https://arxiv.org/abs/2006.16236)."""
  return jax.nn.elu(x) + 1


def relu(x):
  """``max(x, 0)``. Used e.g. by cosFormer (https://arxiv.org/abs/2202.08791)."""
  return jax.nn.relu(x)


def relu_squared(x):
  """``max(x, 0) ** 2``, as in GAU / FLASH (Hua et al. 2022,
  https://arxiv.org/abs/2202.10447) and Primer."""
  return jnp.square(jax.nn.relu(x))


def identity(x):
  """``x`` itself: plain (unnormalised) linear attention, as in RetNet and
  Lightning attention."""
  return x


def taylor(x, scale=None):
  """Second-order Taylor features of ``exp``. Based (Arora et al. 2024,
  https://arxiv.org/abs/2402.18668).

  ``taylor(q, s) . taylor(k, s) == 1 + s (q.k) + (s (q.k))**2 / 2`` exactly.

  Args:
    x: ``[..., K]``.
    scale: ``s``, ``K ** -0.5`` when None.
  Returns:
    ``[..., 1 + K + K * K]``: ``[1, sqrt(s) x, s vec(x x^T) / sqrt(2)]``.
  """
  dk = x.shape[-1]
  scale = dk ** -0.5 if scale is None else scale
  y = x * math.sqrt(scale)
  second = (y[..., :, None] * y[..., None, :]).reshape(x.shape[:-1] + (dk * dk,))
  return jnp.concatenate(
      [jnp.ones_like(x[..., :1]), y, second / math.sqrt(2.0)], axis=-1)


def favor_plus_projection(key, num_features: int, dim: int, *,
                          orthogonal: bool = True):
  """Random projection ``[M, K]`` for FAVOR+. Choromanski et al. 2021,
  "Rethinking Attention with Performers" (https://arxiv.org/abs/2009.14794).

  Rows are Gaussian; with ``orthogonal=True`` they are orthogonal within each
  block of ``K`` rows and rescaled to chi-distributed norms, which lowers the
  estimator's variance. Draw a new projection with a new ``key`` to redraw
  the features.
  """
  if num_features < 1 or dim < 1:
    raise ValueError(f"num_features and dim must be >= 1, got {num_features}, "
                     f"{dim}")
  if not orthogonal:
    return jax.random.normal(key, (num_features, dim), jnp.float32)
  blocks = -(-num_features // dim)
  keys = jax.random.split(key, blocks + 1)
  gaussian = jnp.stack([jax.random.normal(keys[i], (dim, dim), jnp.float32)
                        for i in range(blocks)])                # [blocks, K, K]
  basis = orthonormal_columns(gaussian)                         # [blocks, K, K]
  directions = jnp.swapaxes(basis, -1, -2).reshape(
      blocks * dim, dim)[:num_features]                         # [M, K]
  norms = jnp.linalg.norm(
      jax.random.normal(keys[-1], (num_features, dim), jnp.float32), axis=-1)
  return directions * norms[:, None]


@jax.jit
def orthonormal_columns(x):
  """``Q`` of ``x = Q R`` with ``R``'s diagonal positive, ``x: [..., M, K]``
  with ``M >= K`` (``Q``: ``[..., M, K]``, orthonormal columns).

  Classical Gram-Schmidt applied twice per column (CGS2, orthogonal to
  float32 rounding), matrix-vector products only: a LAPACK QR on CPU is a
  custom call that can starve XLA's intra-op thread pool when two run at
  once. With ``R``'s diagonal positive, ``Q`` of a Gaussian matrix is
  uniformly distributed over orthogonal matrices (a sign-free LAPACK ``Q``
  is not). Jitted: compiled once per shape when called eagerly.
  """
  x = jnp.asarray(x, jnp.float32)
  dim = x.shape[-1]

  def mm(subscripts, *operands):
    return jnp.einsum(subscripts, *operands,
                      precision=jax.lax.Precision.HIGHEST)

  def add_column(j, q):
    # The columns of q after j-1 are still zero: q q^T projects on 0..j-1.
    v = jax.lax.dynamic_index_in_dim(x, j, axis=-1, keepdims=False)  # [..., M]
    for _ in range(2):
      v = v - mm("...mk,...k->...m", q, mm("...mk,...m->...k", q, v))
    v = v / jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True))
    return jax.lax.dynamic_update_index_in_dim(q, v, j, axis=-1)

  return jax.lax.fori_loop(0, dim, add_column, jnp.zeros_like(x))


def favor_plus(x, projection, *, stabilizer=None):
  """FAVOR+ positive random features, an unbiased estimator of ``exp(q.k)``:

      phi(x) = exp(W x - |x|^2 / 2) / sqrt(M),  E[phi(q) . phi(k)] = exp(q . k)

  Args:
    x: ``[..., K]`` (scale it by ``K ** -0.25`` first to estimate softmax
      attention's ``exp(q.k / sqrt(K))``).
    projection: ``[M, K]`` from ``favor_plus_projection``.
    stabilizer: optional value subtracted inside the ``exp`` (e.g. the max of
      ``W x`` over the feature axis for queries); it scales ``phi`` by a
      constant that cancels in normalized attention.
  Returns:
    ``[..., M]``.
  """
  checks.check_float("x", x)
  m, dk = projection.shape
  if x.shape[-1] != dk:
    raise ValueError(f"projection must be [M, K] with K = {x.shape[-1]}, got "
                     f"{projection.shape}")
  xf = x.astype(jnp.float32)
  logits = xf @ projection.T - 0.5 * jnp.sum(xf * xf, axis=-1, keepdims=True)
  if stabilizer is not None:
    logits = logits - stabilizer
  return (jnp.exp(logits) / math.sqrt(m)).astype(x.dtype)


def focused(x, power: float = 3.0, eps: float = 1e-6):
  """The focused map of FLatten Transformer (Han et al. 2023,
  https://arxiv.org/abs/2308.00442): ``relu(x) ** p`` rescaled to the norm
  of ``relu(x)``, which sharpens the direction while keeping the length.
  """
  r = jax.nn.relu(x) + eps
  rp = r ** power
  norm_r = jnp.linalg.norm(r, axis=-1, keepdims=True)
  norm_rp = jnp.linalg.norm(rp, axis=-1, keepdims=True)
  return rp * (norm_r / norm_rp)


FEATURE_MAPS = {
    "elu_plus_one": elu_plus_one,
    "relu": relu,
    "relu_squared": relu_squared,
    "identity": identity,
    "taylor": taylor,
    "focused": focused,
}
