"""The mLSTM layer of xLSTM-7B (Beck et al. 2025, "xLSTM 7B: A Recurrent LLM
for Fast and Efficient Inference", arXiv:2503.13427), as transformers'
``xLSTMLayer``:

    q, k = x W_q, x W_k     [B, T, H, K]  (K = qk_dim_factor * D / H)
    v, o = x W_v, x W_o     [B, T, H, V]  (V = v_dim_factor * D / H)
    i, f = cap(x W_i + b_i), cap(x W_f + b_f)   [B, T, H]
    h = mlstm(q, k, v, i, f)                    (ops.chunk_mlstm)
    y = (sigmoid(o) * LayerNorm_per_head(h)) W_out

with ``cap(z) = c tanh(z / c)``, ``c = gate_soft_cap``. Initialisation as
the reference's: gate kernels 0, input gate bias -10, forget gate biases
``linspace(3, 6, H)``, the q/k/v/o kernels normal with variance ``2 / (5
D)``, the output kernel normal with standard deviation ``2 / (n_blocks
sqrt(D))``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms, checked_impl
from lin_attn_jax.ops import (chunk_mlstm, mlstm_step, parallel_mlstm,
                              recurrent_mlstm)
from lin_attn_jax.ops.mlstm.inputs import STATE_EXTRA

MLSTM_FORMS = OpForms(chunk_mlstm, parallel_mlstm, recurrent_mlstm,
                      mlstm_step)


def soft_cap(x, cap):
  """``cap * tanh(x / cap)`` (None: ``x``)."""
  return x if cap is None else cap * jnp.tanh(x / cap)


class MLSTM(Mixer):
  """xLSTM-7B's mLSTM layer (transformers' ``xLSTMLayer``, ``weight_mode=
  "single"``).

  Args:
    d_model: ``D``. n_heads: ``H``.
    qk_dim_factor: query/key width ``int(qk_dim_factor * D)`` (0.5).
    v_dim_factor: value width ``int(v_dim_factor * D)`` (1.0).
    gate_soft_cap: the cap of the gate pre-activations (15.0; None: none).
    use_bias: biases on q, k, v, the output gate, the head norm and the
      output projection (False).
    norm_eps: epsilon of the per-head LayerNorm (1e-6).
    eps: added to the mLSTM's denominator (1e-6).
    n_blocks: the model's blocks, for the output projection's
      initialisation (1).
    chunk_size: chunk length of the chunk form (speed only); None: the
      backend's default (``base.resolved_chunk_size``).
    impl: the chunk form's implementation (``"auto"``, ``"xla"``,
      ``"pallas"``).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               qk_dim_factor: float = 0.5, v_dim_factor: float = 1.0,
               gate_soft_cap: float | None = 15.0, use_bias: bool = False,
               norm_eps: float = 1e-6, eps: float = 1e-6, n_blocks: int = 1,
               chunk_size: int | None = None, impl: str = "auto",
               dtype=jnp.float32, param_dtype=jnp.float32):
    qk_dim, v_dim = int(d_model * qk_dim_factor), int(d_model * v_dim_factor)
    if qk_dim % n_heads or v_dim % n_heads:
      raise ValueError(f"qk_dim_factor * d_model = {qk_dim} and v_dim_factor "
                       f"* d_model = {v_dim} must divide into n_heads = "
                       f"{n_heads}")
    self.n_heads, self.chunk_size = n_heads, chunk_size
    self.impl = checked_impl(impl)
    self.head_k, self.head_v = qk_dim // n_heads, v_dim // n_heads
    self.gate_soft_cap, self.eps = gate_soft_cap, eps
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    small = nnx.initializers.normal((2 / (5 * d_model)) ** 0.5)
    self.q_proj = modules.dense(d_model, qk_dim, use_bias=use_bias,
                                kernel_init=small, **kw)
    self.k_proj = modules.dense(d_model, qk_dim, use_bias=use_bias,
                                kernel_init=small, **kw)
    self.v_proj = modules.dense(d_model, v_dim, use_bias=use_bias,
                                kernel_init=small, **kw)
    self.o_gate = modules.dense(d_model, v_dim, use_bias=use_bias,
                                kernel_init=small, **kw)
    zeros = nnx.initializers.zeros_init()
    self.i_gate = modules.dense(
        d_model, n_heads, use_bias=True, kernel_init=zeros,
        bias_init=modules.constant_init(-10.0), **kw)
    self.f_gate = modules.dense(
        d_model, n_heads, use_bias=True, kernel_init=zeros,
        bias_init=modules.constant_init(np.linspace(3.0, 6.0, n_heads)),
        **kw)
    self.norm = modules.HeadNorm(n_heads, self.head_v, rngs=rngs,
                                 kind="layer", eps=norm_eps,
                                 param_dtype=param_dtype)
    self.norm_bias = (modules.param(rngs, zeros, (v_dim,), ("heads",),
                                    param_dtype) if use_bias else None)
    self.out_proj = modules.dense(
        v_dim, d_model, ("heads", "embed"), use_bias=use_bias,
        kernel_init=nnx.initializers.normal(2 / n_blocks / d_model ** 0.5),
        **kw)

  def init_mixer_cache(self, batch_size: int, max_len: int, dtype):
    del max_len, dtype
    return jnp.zeros((batch_size, self.n_heads, self.head_k,
                      self.head_v + STATE_EXTRA), jnp.float32)

  def recurrent_state_floats(self, seq_len: int) -> int:
    """``[C | n | m]`` as stored: ``H K (V + 2)`` (``m`` on every row)."""
    del seq_len
    return self.n_heads * self.head_k * (self.head_v + STATE_EXTRA)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h = self.n_heads
    q = self.q_proj(x).reshape(b, t, h, self.head_k)           # [B, T, H, K]
    k = self.k_proj(x).reshape(b, t, h, self.head_k)           # [B, T, H, K]
    v = self.v_proj(x).reshape(b, t, h, self.head_v)           # [B, T, H, V]
    i = soft_cap(self.i_gate(x).astype(jnp.float32), self.gate_soft_cap)
    f = soft_cap(self.f_gate(x).astype(jnp.float32), self.gate_soft_cap)
    # C_t = f_t C_{t-1} + exp(i_t) k_t v_t^T, n_t likewise with k_t,
    # h_t = C_t^T q_t / max(|n_t . q_t|, 1), stabilised by the max state.
    o, state = self.apply_forms(ctx, MLSTM_FORMS,
                                dict(q=q, k=k, v=v, i=i, f=f), ctx.cache,
                                eps=self.eps)                   # [B, T, H, V]
    o = self.norm(o)                                           # [B, T, H*V]
    if self.norm_bias is not None:
      o = o + self.norm_bias[...].astype(o.dtype)
    gate = jax.nn.sigmoid(self.o_gate(x).astype(jnp.float32))
    return self.out_proj((gate * o).astype(x.dtype)), state
