"""HGRN2 layer (Qin et al. 2024, "HGRN2: Gated Linear RNNs with State
Expansion", arXiv:2404.07904).

HGRN's element-wise gated recurrence with its state expanded by an outer
product. Per head, with ``K = expand_ratio`` forget channels and
``V = D / H`` value channels:

    f_t = lb + (1 - lb) * sigmoid(x_t W_f)       forget gate in (lb, 1), [K]
    S_t = diag(f_t) S_{t-1} + (1 - f_t) v_t^T    input gate tied to 1 - f_t
    o_t = S_t^T q_t

with ``q = sigmoid(x W_q)`` (HGRN's output gate, which HGRN2 turns into the
query), ``v = silu(x W_v)``, and ``y = LayerNorm(o) W_o``. With
``use_short_conv`` the three projections ``x W_q``, ``x W_f``, ``x W_v``
first go through short convolutions without activation (as
flash-linear-attention's ``HGRN2Attention`` does to its q, f and i). This is the GLA
recurrence with ``g = log f``, ``k = 1 - f`` and no query scale.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, MatrixStateMixer, checked_impl
from lin_attn_jax.layers.gla import GLA_FORMS
from lin_attn_jax.layers.linear_attn import TORCH_LINEAR_INIT, head_dim
from lin_attn_jax.ops.common import checks


class HGRN2(MatrixStateMixer):
  """Gated linear RNN with an outer-product state and a lower-bounded forget
  gate.

  Projections are initialised uniformly in ``+-1/sqrt(fan_in)`` (PyTorch's
  default, kept by the authors' code), without the biases that code has; the
  LayerNorm over the ``D`` read-out channels starts at scale one and bias
  zero. The cache is the state ``[B, H, K, V]`` float32.

  In the paper the lower bound grows with depth (a cumulative softmax over
  layers of a model-level parameter, zero in the first layer); a mixer does
  not know its depth, so here it is a fixed option, 0 by default (the first
  layer's value).

  The reference (flash-linear-attention's ``HGRN2Attention``) takes one of
  ``expand_ratio`` (128) and the number of heads and derives the other so
  that the forget width ``H K`` is ``D``: square ``[D / H, D / H]`` states.
  Here ``n_heads`` is always given, so ``expand_ratio=None`` (the default)
  keeps that relation, ``K = D / H``; an explicit ``expand_ratio`` sets
  ``K`` (a forget width of ``H K``, which costs in proportion).

  Args:
    d_model: ``D``. n_heads: ``H``; value width per head ``D / H``.
    expand_ratio: ``K``, forget (key) channels per head; None for ``D / H``.
    lower_bound: ``lb`` in ``[0, 1)``, the least forget-gate value.
    use_short_conv: pass ``x W_q``, ``x W_f`` and ``x W_v`` each through a
      depthwise causal convolution without activation before the gates
      (``modules.QKVShortConv``; False, as fla's default).
    conv_size: taps of the short convolutions (4).
    conv_bias: the short convolutions have a bias (False).
    chunk_size: chunk length of the chunk form (speed only); None: 16
      on CPU, 64 on TPU/GPU (``base.resolved_chunk_size``).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the chunk form's
      implementation (``lin_attn_jax.ops.common.dispatch``).
    causal: False for the non-causal layer: every token reads its
      whole document in both directions (``Mixer.set_causal``).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               expand_ratio: int | None = None, lower_bound: float = 0.0,
               use_short_conv: bool = False, conv_size: int = 4,
               conv_bias: bool = False, chunk_size: int | None = None, impl: str = "auto",
               causal: bool = True,
               dtype=jnp.float32, param_dtype=jnp.float32):
    self.set_causal(causal)
    if expand_ratio is None:
      expand_ratio = head_dim(d_model, n_heads, "d_model")
    checks.positive_int("expand_ratio", expand_ratio)
    if not 0.0 <= lower_bound < 1.0:
      raise ValueError(f"lower_bound must be in [0, 1), got {lower_bound!r}")
    self.n_heads, self.chunk_size = n_heads, chunk_size
    self.impl = checked_impl(impl)
    self.head_k, self.lower_bound = expand_ratio, float(lower_bound)
    self.head_v = head_dim(d_model, n_heads, "d_model")
    forget_dim = n_heads * expand_ratio
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype,
              kernel_init=TORCH_LINEAR_INIT)
    self.q_proj = modules.dense(d_model, forget_dim, **kw)
    self.f_proj = modules.dense(d_model, forget_dim, **kw)
    self.v_proj = modules.dense(d_model, d_model, **kw)
    self.short_conv = modules.qkv_short_conv(
        use_short_conv, (forget_dim, forget_dim, d_model), conv_size,
        conv_bias, rngs=rngs, activation=None, param_dtype=param_dtype)
    self.norm = nnx.LayerNorm(
        d_model, epsilon=1e-5, dtype=dtype, param_dtype=param_dtype,
        scale_init=modules.partitioned(nnx.initializers.ones_init(),
                                       ("heads",)),
        bias_init=modules.partitioned(nnx.initializers.zeros_init(),
                                      ("heads",)),
        rngs=rngs)
    self.o_proj = modules.dense(d_model, d_model, ("heads", "embed"), **kw)

  def gates(self, f):
    """``(g, k)``: log forget gate (float32) and input gate ``1 - f`` (in
    f's dtype), both ``[B, T, H * K]``, from the forget logits ``f = x W_f``
    (convolved with ``use_short_conv``)."""
    logits = f.astype(jnp.float32)
    lb = self.lower_bound
    if lb == 0.0:
      g = jax.nn.log_sigmoid(logits)
    else:
      # log(lb + (1 - lb) sigmoid), kept <= 0 against rounding.
      g = jnp.minimum(jnp.logaddexp(math.log(lb), math.log1p(-lb)
                                    + jax.nn.log_sigmoid(logits)), 0.0)
    k = (1.0 - lb) * jax.nn.sigmoid(-logits)
    return g, k.astype(f.dtype)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h = self.n_heads
    (q, f, v), conv, cache = self.short_convolved(
        self.q_proj(x), self.f_proj(x), self.v_proj(x), ctx)
    q = jax.nn.sigmoid(q).reshape(b, t, h, self.head_k)         # [B, T, H, K]
    g, k = self.gates(f)
    g = g.reshape(b, t, h, self.head_k)                         # [B, T, H, K]
    k = k.reshape(b, t, h, self.head_k)                         # [B, T, H, K]
    v = jax.nn.silu(v).reshape(b, t, h, self.head_v)            # [B, T, H, V]
    # S_t = diag(f_t) S_{t-1} + (1 - f_t) v_t^T,  o_t = S_t^T q_t
    o, state = self.apply_forms(ctx, GLA_FORMS, dict(q=q, k=k, v=v, g=g),
                                cache, scale=1.0)               # [B, T, H, V]
    y = self.o_proj(self.norm(o.reshape(b, t, -1)))             # [B, T, D]
    return y, self.joined_cache(conv, state)
