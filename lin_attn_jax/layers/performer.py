"""Performer layer: FAVOR+ attention (Choromanski et al. 2021, "Rethinking
Attention with Performers", arXiv:2009.14794).

``q, k, v = x W_q, x W_k, x W_v`` over ``H`` heads of ``K = D / H``. Softmax
attention's ``exp(q . k / sqrt(K))`` is estimated by positive orthogonal
random features, ``phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(M)`` with
``x' = x / K ** 0.25`` and ``W: [M, K]`` drawn once per layer (shared by the
heads); then normalized linear attention

    o_t = phi(q_t)^T sum_{j<=t} phi(k_j) v_j^T
          / (phi(q_t) . sum_{j<=t} phi(k_j))

and ``y = o W_o``. ``W`` is not trained; ``redraw`` draws a new one (the
paper's feature redrawing).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax import feature_maps
from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import (Context, Mixer, OpForms, checked_impl,
                                      zero_state)
from lin_attn_jax.layers.linear_attn import head_dim
from lin_attn_jax.ops import (chunk_favor_attn, linear_attn_step,
                              parallel_linear_attn, recurrent_linear_attn)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.performer.heads_first import heads_first_features


def favor_features(x, projection, *, query: bool):
  """FAVOR+ features ``[B, T, H, K] -> [B, T, H, M]`` float32 (queries
  shifted by their largest exponent), as ``ops.chunk_favor_attn`` makes
  them."""
  return jnp.swapaxes(heads_first_features(x, projection, query=query), 1, 2)


def _on_features(form):
  """``form``, a normalized linear-attention form of features, as a form of
  raw ``q, k: [B, T, H, K]`` and the ``projection``."""

  def favor_form(q, k, v, projection, **options):
    return form(favor_features(q, projection, query=True),
                favor_features(k, projection, query=False), v, scale=1.0,
                normalize=True, **options)

  return favor_form


def _favor_step(q, k, v, projection, state=None, *, reset=None):
  """One token of ``q, k: [B, H, K]``, ``v: [B, H, V]``: ``(o [B, H, V],
  state)``."""
  qf = favor_features(q[:, None], projection, query=True)[:, 0]  # [B, H, M]
  kf = favor_features(k[:, None], projection, query=False)[:, 0]
  return linear_attn_step(qf, kf, v, state, scale=1.0, normalize=True,
                          reset=reset)


# Normalized linear attention of FAVOR+ features, every form taking the raw
# q, k and the projection (the chunk form maps them in its own layout).
FAVOR_FORMS = OpForms(chunk_favor_attn, _on_features(parallel_linear_attn),
                      _on_features(recurrent_linear_attn), _favor_step)


def default_nb_features(dim: int) -> int:
  """``int(K ln K)`` random features for heads of ``K`` channels (at least
  ``K``), the default of performer-pytorch (``d log d`` for head width
  ``d``).

  At ``K = 64`` it gives 266, close to the fixed 256 of the paper's own
  code; it scales the feature count with the head width instead, where a
  fixed 256 spends 8 features per channel at ``K = 32`` (110 by this rule).
  Performer's state is ``M x (K + 1)`` per head and its step time grows
  with ``M``.
  """
  return max(dim, int(dim * math.log(dim)))


class RandomProjection(nnx.Variable):
  """A random, non-trainable projection. Not an ``nnx.Param``: gradients and
  optimizers taken over ``nnx.Param`` leave it alone."""


class Performer(Mixer):
  """Causal FAVOR+ attention with a redrawable random projection.

  The projection ``[M, K]`` is float32 (a ``RandomProjection``, drawn by
  ``feature_maps.favor_plus_projection`` from the ``params`` stream at
  construction); the q/k/v/o projections are LeCun normal (the Flax
  ``Dense`` default of the paper's code). Query features are shifted by
  their own maximum of ``w . x`` (dropping ``|x|^2 / 2``: both are per-query
  constants that cancel in the normalization) so that a long query cannot
  underflow them all; key exponents ``w . x - |x|^2 / 2`` are at most
  ``|w|^2 / 2`` and need no shift. The projection enters as a constant (no
  gradient is made for it). The chunk form is ``ops.chunk_favor_attn``,
  which makes the features itself in the layout of its matmuls. The cache is
  the state ``[B, H, M, K + 1]`` float32.

  Args:
    d_model: ``D``. n_heads: ``H``.
    nb_features: ``M``, the number of random features; None for
      ``default_nb_features(K)``, ``int(K ln K)``.
    orthogonal: orthogonal random rows (FAVOR+); False draws i.i.d. rows.
    chunk_size: chunk length of the chunk form (speed only).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the chunk form's
      implementation (``lin_attn_jax.ops.common.dispatch``).
    causal: False for the non-causal layer: every token reads its
      whole document in both directions (``Mixer.set_causal``).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               nb_features: int | None = None, orthogonal: bool = True,
               chunk_size: int = 64, impl: str = "auto",
               causal: bool = True, dtype=jnp.float32,
               param_dtype=jnp.float32):
    self.set_causal(causal)
    checks.positive_int("nb_features", nb_features, allow_none=True)
    self.n_heads, self.chunk_size = n_heads, chunk_size
    self.impl = checked_impl(impl)
    self.head_dim = head_dim(d_model, n_heads, "d_model")
    if nb_features is None:
      nb_features = default_nb_features(self.head_dim)
    self.nb_features, self.orthogonal = nb_features, orthogonal
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, d_model, **kw)
    self.k_proj = modules.dense(d_model, d_model, **kw)
    self.v_proj = modules.dense(d_model, d_model, **kw)
    self.o_proj = modules.dense(d_model, d_model, ("heads", "embed"), **kw)
    self.projection = RandomProjection(self._draw(rngs.params()))

  def _draw(self, key):
    return feature_maps.favor_plus_projection(
        key, self.nb_features, self.head_dim, orthogonal=self.orthogonal)

  def redraw(self, key) -> None:
    """Replaces the random projection by a new draw from ``key``."""
    self.projection[...] = self._draw(key)

  def _projection(self):
    """``W`` as a constant: never trained, so no gradient is made for it."""
    return jax.lax.stop_gradient(self.projection[...])

  def features(self, x, *, query: bool):
    """``favor_features`` of ``x [B, T, H, K]`` with this layer's
    projection: ``[B, T, H, M]`` float32."""
    return favor_features(x, self._projection(), query=query)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return zero_state(batch_size, self.n_heads, self.nb_features,
                      self.head_dim + 1)

  def recurrent_state_floats(self, seq_len):
    """``H x M x (K + 1)`` (values and the normalizer)."""
    del seq_len
    return self.n_heads * self.nb_features * (self.head_dim + 1)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    shape = (b, t, self.n_heads, self.head_dim)
    q = self.q_proj(x).reshape(shape)                           # [B, T, H, K]
    k = self.k_proj(x).reshape(shape)                           # [B, T, H, K]
    v = self.v_proj(x).reshape(shape)                           # [B, T, H, K]
    # o_t = phi(q_t)^T S_t / (phi(q_t) . z_t),  S_t = S_{t-1} + phi(k_t) v_t^T
    o, state = self.apply_forms(ctx, FAVOR_FORMS, dict(q=q, k=k, v=v),
                                ctx.cache, projection=self._projection())
    return self.o_proj(o.reshape(b, t, -1)), state              # [B, T, D]
