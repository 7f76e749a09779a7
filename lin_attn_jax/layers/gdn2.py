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
from lin_attn_jax.layers.base import OpForms
from lin_attn_jax.layers.deltanet import KDA
from lin_attn_jax.layers.mamba import dt_bias_init
from lin_attn_jax.ops import (chunk_gdn2, gdn2_step, parallel_gdn2,
                              recurrent_gdn2)

_F32 = jnp.float32
GDN2_FORMS = OpForms(chunk_gdn2, parallel_gdn2, recurrent_gdn2, gdn2_step)


class GatedDeltaNet2(KDA):
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

  KDA's decay, output gate, norm, cache and ``mix``, with the erase and
  write gates as the op's inputs (``op_gates``) where KDA has ``beta``.

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

  dt_bias_init = staticmethod(dt_bias_init(1e-3, 0.1, 1e-4))

  @property
  def forms(self) -> OpForms:
    return GDN2_FORMS

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               expand_k: float = 1.0, expand_v: float = 1.0,
               use_short_conv: bool = True, conv_size: int = 4,
               conv_bias: bool = False, allow_neg_eigval: bool = False,
               norm_eps: float = 1e-5, n_v_heads: int | None = None,
               head_k_dim: int | None = None, head_v_dim: int | None = None,
               chunk_size: int | None = None, impl: str = "auto",
               dtype=_F32, param_dtype=_F32):
    key_dim, value_dim = self.init_heads(
        d_model, n_heads, expand_k=expand_k, expand_v=expand_v,
        n_v_heads=n_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim,
        chunk_size=chunk_size, impl=impl, allow_neg_eigval=allow_neg_eigval)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.init_qkv(d_model, key_dim, value_dim, use_short_conv=use_short_conv,
                  conv_size=conv_size, conv_bias=conv_bias, **kw)
    self.b_proj = modules.dense(d_model, key_dim, **kw)
    self.w_proj = modules.dense(d_model, value_dim, **kw)
    self.init_decay(d_model, **kw)
    self.init_output_gate(d_model, True, **kw)
    self.init_readout(d_model, norm_eps, **kw)

  def op_gates(self, x):
    """``g`` and ``b`` of the q/k heads repeated to the value heads, ``[B,
    T, HV, K]`` float32, and ``w [B, T, HV, V]`` float32."""
    bs, t, _ = x.shape
    h, hv, dk = self.n_heads, self.n_v_heads, self.head_k
    g = self.log_decay(x)                                       # [B, T, H, K]
    b = jax.nn.sigmoid(self.b_proj(x).astype(_F32)).reshape(bs, t, h, dk)
    if self.allow_neg_eigval:
      b = 2.0 * b
    if hv > h:
      g, b = (jnp.repeat(y, hv // h, axis=2) for y in (g, b))  # [B,T,HV,K]
    w = jax.nn.sigmoid(self.w_proj(x).astype(_F32))
    return dict(g=g, b=b, w=w.reshape(bs, t, hv, self.head_v))
