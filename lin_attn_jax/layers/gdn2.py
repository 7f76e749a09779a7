"""Gated DeltaNet-2: KDA's layer with vector erase and write gates.

    q, k, v = silu(short_conv(x W_{q,k,v}))      q, k L2-normalised by the op
    g = -exp(A_log) * softplus(f_up(f_down(x)) + dt_bias)      [B, T, H, K]
    b = sigmoid(x W_b)  [B, T, H, K]      w = sigmoid(x W_w)  [B, T, HV, V]
    S_t = (I - k_t (b_t * k_t)^T) diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T
    o_t = S_t^T (q_t / sqrt(K))
    y = W_o (rms_norm(o) * sigmoid(g_up(g_down(x))))

flash-linear-attention's ``layers/gdn2.py`` (``GatedDeltaNet2``, adapted
from NVlabs/GatedDeltaNet-2). The cache is ``{"conv": the windows of the
three short convolutions, "state": the [B, HV, K, V] float32 state}``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import (Context, Mixer, OpForms, checked_impl,
                                      zero_state)
from lin_attn_jax.layers.deltanet import a_log_init, head_dims
from lin_attn_jax.layers.mamba import dt_bias_init
from lin_attn_jax.ops import (chunk_gdn2, gdn2_step, parallel_gdn2,
                              recurrent_gdn2)
from lin_attn_jax.ops.common import checks

_F32 = jnp.float32
GDN2_FORMS = OpForms(chunk_gdn2, parallel_gdn2, recurrent_gdn2, gdn2_step)


class GatedDeltaNet2(Mixer):
  """Gated DeltaNet-2 (flash-linear-attention's ``GatedDeltaNet2``).

  The reference's projections, gates and norm: q, k, v projections (no
  bias) through silu short convolutions; the decay per key channel from a
  low-rank projection (``f_down: D -> head_v``, ``f_up: head_v -> H K``),
  ``g = -exp(A_log) * softplus(f + dt_bias)`` with ``A_log`` per query/key
  head (``A ~ U(1, 16)``) and ``dt_bias`` per key channel (Mamba's init:
  ``softplus(dt_bias)`` log-uniform in ``[1e-3, 0.1]``, at least
  ``1e-4``); the erase gate ``b = sigmoid(x W_b)`` per key channel (times 2
  with ``allow_neg_eigval``) and the write gate ``w = sigmoid(x W_w)`` per
  value channel; grouped value heads repeat q, k, g and b; the output
  ``W_o (rms_norm(o) * sigmoid(g_up(g_down(x))))`` with ``g_down: D ->
  head_v`` and ``g_up: head_v -> HV V`` (with a bias).

  Two differences from the reference, both at initialisation only: the
  dense projections are drawn LeCun normal as everywhere in this package
  (the reference leaves PyTorch's ``Linear`` default, uniform with variance
  ``1 / (3 fan_in)``; fla has no GDN-2 model whose ``_init_weights`` would
  redraw them), and the RMSNorm's scale has one entry per head and channel
  (``HV V``, ones) where the reference shares one ``V`` across heads.

  Args:
    d_model: ``D``. n_heads: ``H``.
    expand_k, expand_v: key and value widths per head are ``expand * D /
      H`` (1.0 each: the reference's 16 heads of 128 at ``D = 2048``).
    use_short_conv: the short convolutions of q, k and v (True).
    conv_size: their taps (4). conv_bias: their bias (False).
    allow_neg_eigval: ``b = 2 sigmoid(.)`` in (0, 2) (False).
    norm_eps: epsilon of the RMSNorm (1e-5).
    n_v_heads: ``HV``, value heads (and heads of the gates and the state),
      a multiple of ``H``; None for ``H``.
    head_k_dim, head_v_dim: explicit widths per head (replace ``expand_k``
      and ``expand_v``).
    chunk_size: chunk length of the chunk form (speed only); None: 16 on
      CPU, 64 on TPU/GPU.
    impl: ``"auto"``, ``"xla"`` or ``"pallas"`` (the chunk form's sweep).
  """

  no_weight_decay = ("A_log", "dt_bias")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               expand_k: float = 1.0, expand_v: float = 1.0,
               use_short_conv: bool = True, conv_size: int = 4,
               conv_bias: bool = False, allow_neg_eigval: bool = False,
               norm_eps: float = 1e-5, n_v_heads: int | None = None,
               head_k_dim: int | None = None, head_v_dim: int | None = None,
               chunk_size: int | None = None, impl: str = "auto",
               dtype=_F32, param_dtype=_F32):
    for name, value in (("n_v_heads", n_v_heads), ("head_k_dim", head_k_dim),
                        ("head_v_dim", head_v_dim)):
      checks.positive_int(name, value, allow_none=True)
    checks.positive_int("conv_size", conv_size)
    if head_k_dim is None or head_v_dim is None:
      head_k, head_v = head_dims(d_model, n_heads, expand_k, expand_v)
    self.head_k = head_k if head_k_dim is None else head_k_dim
    self.head_v = head_v if head_v_dim is None else head_v_dim
    n_v_heads = n_heads if n_v_heads is None else n_v_heads
    if n_v_heads % n_heads:
      raise ValueError(f"n_v_heads = {n_v_heads} must be a multiple of "
                       f"n_heads = {n_heads}")
    self.n_heads, self.n_v_heads = n_heads, n_v_heads
    self.chunk_size = chunk_size
    self.impl = checked_impl(impl)
    self.allow_neg_eigval = allow_neg_eigval
    key_dim, value_dim = n_heads * self.head_k, n_v_heads * self.head_v
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, key_dim, **kw)
    self.k_proj = modules.dense(d_model, key_dim, **kw)
    self.v_proj = modules.dense(d_model, value_dim, **kw)
    self.short_conv = modules.qkv_short_conv(
        use_short_conv, (key_dim, key_dim, value_dim), conv_size, conv_bias,
        rngs=rngs, param_dtype=param_dtype)
    self.f_down = modules.dense(d_model, self.head_v, ("embed", "rank"), **kw)
    self.f_up = modules.dense(self.head_v, key_dim, ("rank", "heads"), **kw)
    self.b_proj = modules.dense(d_model, key_dim, **kw)
    self.w_proj = modules.dense(d_model, value_dim, **kw)
    self.A_log = modules.param(rngs, a_log_init(), (n_heads,), ("heads",),
                               param_dtype)
    self.dt_bias = modules.param(rngs, dt_bias_init(1e-3, 0.1, 1e-4),
                                 (key_dim,), ("heads",), param_dtype)
    self.g_down = modules.dense(d_model, self.head_v, ("embed", "rank"), **kw)
    self.g_up = modules.dense(self.head_v, value_dim, ("rank", "heads"),
                              use_bias=True, **kw)
    self.norm = modules.HeadNorm(n_v_heads, self.head_v, rngs=rngs,
                                 eps=norm_eps, param_dtype=param_dtype)
    self.o_proj = modules.dense(value_dim, d_model, ("heads", "embed"), **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return self.with_conv_cache(batch_size, zero_state(
        batch_size, self.n_v_heads, self.head_k, self.head_v))

  def recurrent_state_floats(self, seq_len):
    """``HV x K x V``."""
    del seq_len
    return self.n_v_heads * self.head_k * self.head_v

  def gates(self, x):
    """``(g, b)`` of q/k heads repeated to the value heads, ``[B, T, HV,
    K]`` float32, and ``w [B, T, HV, V]`` float32."""
    bs, t, _ = x.shape
    h, hv, dk = self.n_heads, self.n_v_heads, self.head_k
    f = self.f_up(self.f_down(x)).astype(_F32) + self.dt_bias[...].astype(_F32)
    f = jax.nn.softplus(f).reshape(bs, t, h, dk)
    g = -jnp.exp(self.A_log[...].astype(_F32))[:, None] * f    # [B, T, H, K]
    b = jax.nn.sigmoid(self.b_proj(x).astype(_F32)).reshape(bs, t, h, dk)
    if self.allow_neg_eigval:
      b = 2.0 * b
    if hv > h:
      g, b = (jnp.repeat(y, hv // h, axis=2) for y in (g, b))  # [B,T,HV,K]
    w = jax.nn.sigmoid(self.w_proj(x).astype(_F32))
    return g, b, w.reshape(bs, t, hv, self.head_v)

  def mix(self, x, ctx: Context):
    bs, t, _ = x.shape
    h, hv = self.n_heads, self.n_v_heads
    (q, k, v), conv, cache = self.short_convolved(
        self.q_proj(x), self.k_proj(x), self.v_proj(x), ctx)
    q = q.reshape(bs, t, h, self.head_k)                        # [B, T, H, K]
    k = k.reshape(bs, t, h, self.head_k)                        # [B, T, H, K]
    v = v.reshape(bs, t, hv, self.head_v)                       # [B, T, HV, V]
    g, b, w = self.gates(x)
    # S_t = (I - k_t (b_t * k_t)^T) diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T
    # o_t = S_t^T q_t / sqrt(K), q and k L2-normalised by the op
    o, state = self.apply_forms(ctx, GDN2_FORMS,
                                dict(q=q, k=k, v=v, g=g, b=b, w=w), cache,
                                use_qk_l2norm=True)             # [B, T, HV, V]
    gate = jax.nn.sigmoid(self.g_up(self.g_down(x)).astype(_F32))
    o = (self.norm(o).astype(_F32) * gate).astype(o.dtype)      # [B, T, HV*V]
    return self.o_proj(o), self.joined_cache(conv, state)
