"""Agent Attention layer (Han et al. 2024, arXiv:2312.08874), on sequences.

``q, k, v = x W_qkv``; the agent tokens are the queries average-pooled to
``N`` positions; ``o = softmax(q A^T + B_2) softmax(A k^T + B_1) v`` per
head (``ops.agent_attn``), plus the depthwise convolution of ``v`` (the
paper's DWC term, restoring feature diversity), then ``y = o W_o + b_o``.
The reference's agent biases are a ``[H, N, 7, 7]`` table resized to the
window plus row and column terms of the window's fixed size; on 1-D
sequences of any length the bias is a ``[H, N, bias_size]`` table (7 by
default) resized linearly to ``T`` in each direction, without the row and
column terms, and the DWC is a 1-D ``same`` convolution of width 3 (the
reference's 3x3).

Not causal: no cache, no recurrent mode. A row holds one document (see
``ops.agent_attn``).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer
from lin_attn_jax.layers.encoder_modules import (checks_width, conv_weight,
                                                 resize_matrix)
from lin_attn_jax.layers.softmax import head_layout
from lin_attn_jax.ops import agent_attn
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.pooling import same_depthwise_conv


class AgentAttention(Mixer):
  """Softmax attention through ``agent_num`` agent tokens (non-causal).

  Args:
    d_model: ``D``. n_heads: ``H``.
    agent_num: ``N``, the agent tokens (49, the reference's 7x7 pool).
    agent_bias: learn the agent biases (the reference's position biases).
    bias_size: the length of the bias tables before their resize to ``T``.
    dwc_kernel: width of the DWC term on ``v`` (odd), None to leave it out.
    qkv_bias: a bias on the q, k, v projection (the reference's Swin
      blocks: True).
  """

  causal = False

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               agent_num: int = 49, agent_bias: bool = True,
               bias_size: int = 7, dwc_kernel: int | None = 3,
               qkv_bias: bool = True, dtype=jnp.float32,
               param_dtype=jnp.float32):
    _, self.head_dim = head_layout(d_model, n_heads, None)
    checks.positive_int("agent_num", agent_num)
    checks.positive_int("bias_size", bias_size)
    if dwc_kernel is not None:
      checks_width(dwc_kernel)
    self.n_heads, self.agent_num, self.dtype = n_heads, agent_num, dtype
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.qkv_proj = modules.dense(d_model, 3 * d_model, use_bias=qkv_bias,
                                  **kw)
    self.o_proj = modules.dense(d_model, d_model, ("heads", "embed"),
                                use_bias=True, **kw)
    init = nnx.initializers.normal(stddev=0.02)
    shape = (n_heads, agent_num, bias_size)
    self.an_bias = (modules.param(rngs, init, shape, ("heads", None, None),
                                  param_dtype) if agent_bias else None)
    self.na_bias = (modules.param(rngs, init, shape, ("heads", None, None),
                                  param_dtype) if agent_bias else None)
    self.dwc_weight = (None if dwc_kernel is None else
                       conv_weight(rngs, d_model, dwc_kernel, param_dtype))
    self.dwc_bias = (None if dwc_kernel is None else modules.param(
        rngs, nnx.initializers.zeros_init(), (d_model,), ("heads",),
        param_dtype))

  def init_mixer_cache(self, batch_size, max_len, dtype):
    raise ValueError("AgentAttention is not causal: it has no cache")

  def mix(self, x, ctx: Context):
    b, t, d = x.shape
    h, hd = self.n_heads, self.head_dim
    q, k, v = jnp.split(self.qkv_proj(x), 3, axis=-1)           # [B, T, D]
    biases = {}
    if self.an_bias is not None:
      resize = resize_matrix(self.an_bias.shape[-1], t)         # [S, T]
      biases["agent_bias"] = jnp.einsum(
          "hns,st->hnt", self.an_bias[...], resize)             # [H, N, T]
      biases["query_bias"] = jnp.einsum(
          "hns,st->htn", self.na_bias[...], resize)             # [H, T, N]
    o = agent_attn(q.reshape(b, t, h, hd), k.reshape(b, t, h, hd),
                   v.reshape(b, t, h, hd), agent_num=self.agent_num,
                   segment_ids=ctx.segment_ids, **biases)       # [B, T, H, V]
    o = o.reshape(b, t, d)
    if self.dwc_weight is not None:
      o = o + same_depthwise_conv(v, self.dwc_weight[...],
                                  bias=self.dwc_bias[...],
                                  segment_ids=ctx.segment_ids).astype(o.dtype)
    return self.o_proj(o.astype(self.dtype)), None
