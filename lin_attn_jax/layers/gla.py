"""Gated Linear Attention layer (Yang et al., 2023, arXiv:2312.06635).

``q, k = x W_q, x W_k`` (``K = expand_k * D / H`` per head), ``v = x W_v``
(each through a short convolution with SiLU with ``use_short_conv``, as
flash-linear-attention's layer); the forget gate per key channel comes from a low-rank projection,
``g = log_sigmoid(W_2 W_1 x + b) / gate_logit_normalizer``; the output is
``W_o (rms_norm(o) * silu(x W_r))`` with a per-head RMSNorm.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import (Context, MatrixStateMixer, OpForms,
                                      checked_impl)
from lin_attn_jax.ops import chunk_gla, gla_step, parallel_gla, recurrent_gla

GLA_FORMS = OpForms(chunk_gla, parallel_gla, recurrent_gla, gla_step)


class GLA(MatrixStateMixer):
  """Gated linear attention with a low-rank per-channel forget gate.

  Args:
    d_model: ``D``. n_heads: ``H``.
    expand_k: key width per head is ``expand_k * D / H`` (0.5 in the paper).
    expand_v: value width per head is ``expand_v * D / H``.
    gate_low_rank_dim: rank of the gate projection (16).
    gate_logit_normalizer: divides the log-sigmoid gate (16), so decays start
      close to 1.
    norm_eps: epsilon of the per-head RMSNorm (1e-5).
    use_short_conv: pass q, k and v each through a depthwise causal
      convolution with SiLU right after its projection
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
               expand_k: float = 0.5, expand_v: float = 1.0,
               gate_low_rank_dim: int = 16, gate_logit_normalizer: float = 16.0,
               norm_eps: float = 1e-5, use_short_conv: bool = False,
               conv_size: int = 4, conv_bias: bool = False,
               chunk_size: int | None = None, impl: str = "auto",
               causal: bool = True,
               dtype=jnp.float32, param_dtype=jnp.float32):
    self.set_causal(causal)
    key_dim, value_dim = int(d_model * expand_k), int(d_model * expand_v)
    if key_dim % n_heads or value_dim % n_heads:
      raise ValueError(f"expand_k * d_model = {key_dim} and expand_v * "
                       f"d_model = {value_dim} must divide into n_heads = "
                       f"{n_heads}")
    self.n_heads, self.chunk_size = n_heads, chunk_size
    self.impl = checked_impl(impl)
    self.head_k, self.head_v = key_dim // n_heads, value_dim // n_heads
    self.gate_logit_normalizer = gate_logit_normalizer
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, key_dim, **kw)
    self.k_proj = modules.dense(d_model, key_dim, **kw)
    self.v_proj = modules.dense(d_model, value_dim, **kw)
    self.short_conv = modules.qkv_short_conv(
        use_short_conv, (key_dim, key_dim, value_dim), conv_size, conv_bias,
        rngs=rngs, param_dtype=param_dtype)
    self.gate_down = modules.dense(d_model, gate_low_rank_dim,
                                   ("embed", "rank"), **kw)
    self.gate_up = modules.dense(gate_low_rank_dim, key_dim, ("rank", "heads"),
                                 use_bias=True, **kw)
    self.out_gate = modules.dense(d_model, value_dim, **kw)
    self.norm = modules.HeadNorm(n_heads, self.head_v, rngs=rngs,
                                 eps=norm_eps, param_dtype=param_dtype)
    self.o_proj = modules.dense(value_dim, d_model, ("heads", "embed"), **kw)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h = self.n_heads
    (q, k, v), conv, cache = self.short_convolved(
        self.q_proj(x), self.k_proj(x), self.v_proj(x), ctx)
    q = q.reshape(b, t, h, self.head_k)                         # [B, T, H, K]
    k = k.reshape(b, t, h, self.head_k)                         # [B, T, H, K]
    v = v.reshape(b, t, h, self.head_v)                         # [B, T, H, V]
    g = jax.nn.log_sigmoid(
        self.gate_up(self.gate_down(x)).astype(jnp.float32))
    g = (g / self.gate_logit_normalizer).reshape(b, t, h, self.head_k)
    # S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t / sqrt(K)
    o, state = self.apply_forms(ctx, GLA_FORMS, dict(q=q, k=k, v=v, g=g),
                                cache)                          # [B, T, H, V]
    y = self.o_proj(self.norm(o, self.out_gate(x)))             # [B, T, D]
    return y, self.joined_cache(conv, state)
