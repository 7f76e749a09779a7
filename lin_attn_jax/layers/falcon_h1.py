"""Falcon-H1's parallel hybrid mixer (Falcon-LLM Team 2025,
arXiv:2507.22448; transformers' ``FalconH1DecoderLayer``): softmax
attention and a Mamba-2 block side by side on the same normalised input,
their outputs summed, with Falcon-H1's muP multipliers::

    y = m_ao attn(m_ai x) + m_so mamba2(m_si x)

So the LM's block stays one mixer and one MLP: ``x + y(norm(x))``, then
the MLP. The two halves are the zoo's own ``SoftmaxAttention`` (with
``key_multiplier``) and ``Mamba2`` (with ``in_proj_multipliers``, the
``ssm_multipliers`` on its ``z, x, B, C, dt`` projections); each keeps
its own forms, cache and context parallelism (the attention's gathered
keys and values, Mamba-2's state passing and the convolution's halo over a
``"sequence"`` mesh axis).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers.base import Context, Mixer
from lin_attn_jax.layers.mamba2 import Mamba2
from lin_attn_jax.layers.softmax import SoftmaxAttention


class FalconH1Parallel(Mixer):
  """Attention and Mamba-2 in parallel (see the module docstring).

  Args:
    d_model: ``D``. n_heads: the attention's query heads.
    n_kv_heads, head_dim, rope_base: the attention's (``SoftmaxAttention``;
      None, None: ``D / H``, 10000).
    attention_bias: biases on q, k, v and o (False).
    key_multiplier: factor on the keys (1.0).
    mamba_n_heads: Mamba-2's heads (None: ``n_heads``).
    mamba_head_dim: Mamba-2's head width ``P`` (None: ``mamba_expand * D /
      mamba_n_heads``); given, the inner width is ``mamba_n_heads * P``
      (transformers' ``mamba_d_ssm``).
    mamba_expand: inner width over ``D`` when ``mamba_head_dim`` is None
      (2).
    d_state, d_conv, n_groups: Mamba-2's (64, 4, 1, as ``Mamba2``;
      transformers' ``mamba_d_state`` 256, ``mamba_d_conv`` 4,
      ``mamba_n_groups`` 1).
    mamba_conv_bias, mamba_proj_bias, projectors_bias: biases of the
      convolution (True), the input projection (False) and the output
      projection (False).
    mamba_rms_norm, mamba_norm_before_gate: Mamba-2's gated RMSNorm
      (False: ``y * silu(z)``; True: ``rms_norm(y) * silu(z)`` when the norm
      is on), as transformers' defaults.
    norm_eps: epsilon of that norm (1e-5, the config's ``rms_norm_eps``).
    ssm_multipliers: the five factors on Mamba-2's ``z, x, B, C, dt``
      projections ((1,) * 5).
    time_step_limit: Mamba-2's clamp of the time step ((0, inf)).
    attention_in_multiplier, attention_out_multiplier, ssm_in_multiplier,
      ssm_out_multiplier: ``m_ai``, ``m_ao``, ``m_si``, ``m_so`` (1.0).
    chunk_size, impl: Mamba-2's chunk form (speed only).
    block_size: the attention's blockwise form (speed only).

  Initialisation: each half's own (``SoftmaxAttention``, ``Mamba2``);
  transformers starts ``A_log = log(1 .. H)``, ``dt_bias = 1`` and ``D =
  1`` instead (weights load over either).

  Parameters against transformers' ``FalconH1DecoderLayer`` (prefix
  ``self_attn.`` and ``mamba.`` on both sides; a kernel is the transpose
  of a ``Linear`` weight):

  - ``self_attn.{q,k,v,o}_proj.kernel``: ``self_attn.{q,k,v,o}_proj.weight``
    (``[H K, D]``, ``[Hkv K, D]``, ``[Hkv K, D]``, ``[D, H K]``), biases
    ``.bias``;
  - ``mamba.in_proj.kernel [D, 2 E + 2 G N + H_m]``: ``mamba.in_proj.weight``
    (rows ``z, x, B, C, dt``); ``mamba.conv.weight [E + 2 G N, W]``:
    ``mamba.conv1d.weight [E + 2 G N, 1, W]``, ``mamba.conv.bias``:
    ``mamba.conv1d.bias``; ``mamba.dt_bias``, ``mamba.A_log``, ``mamba.D
    [H_m]``: the same names; ``mamba.norm.scale [E]``:
    ``mamba.norm.weight`` (with ``mamba_rms_norm``);
    ``mamba.out_proj.kernel [E, D]``: ``mamba.out_proj.weight``.

  transformers clamps the time step to ``time_step_limit`` in its chunked
  form but not in its one-token step; this layer clamps in every form
  (the same with the default ``(0, inf)``).

  Cache: ``{"attention": the KVCache, "mamba": Mamba-2's cache}``.
  """

  no_weight_decay = ("mamba.A_log", "mamba.dt_bias", "mamba.D")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               n_kv_heads: int | None = None, head_dim: int | None = None,
               rope_base: float = 10000.0, attention_bias: bool = False,
               key_multiplier: float = 1.0, mamba_n_heads: int | None = None,
               mamba_head_dim: int | None = None, mamba_expand: float = 2,
               d_state: int = 64, d_conv: int = 4, n_groups: int = 1,
               mamba_conv_bias: bool = True, mamba_proj_bias: bool = False,
               projectors_bias: bool = False, mamba_rms_norm: bool = False,
               mamba_norm_before_gate: bool = True, norm_eps: float = 1e-5,
               ssm_multipliers: tuple[float, ...] = (1.0,) * 5,
               time_step_limit: tuple[float, float] = (0.0, float("inf")),
               attention_in_multiplier: float = 1.0,
               attention_out_multiplier: float = 1.0,
               ssm_in_multiplier: float = 1.0,
               ssm_out_multiplier: float = 1.0, chunk_size: int = 64,
               impl: str = "auto", block_size: int = 128, dtype=jnp.float32,
               param_dtype=jnp.float32):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.self_attn = SoftmaxAttention(
        d_model, n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
        rope_base=rope_base, qkv_bias=attention_bias,
        out_bias=attention_bias, key_multiplier=key_multiplier,
        block_size=block_size, **kw)
    self.mamba = Mamba2(
        d_model, n_heads if mamba_n_heads is None else mamba_n_heads,
        d_state=d_state, d_conv=d_conv, expand=mamba_expand,
        n_groups=n_groups, conv_bias=mamba_conv_bias, bias=mamba_proj_bias,
        out_bias=projectors_bias, norm_eps=norm_eps, head_dim=mamba_head_dim,
        time_step_limit=time_step_limit, chunk_size=chunk_size, impl=impl,
        rms_norm=mamba_rms_norm, norm_before_gate=mamba_norm_before_gate,
        in_proj_multipliers=(None if tuple(ssm_multipliers) == (1.0,) * 5
                             else ssm_multipliers), **kw)
    self.multipliers = tuple(float(m) for m in (
        attention_in_multiplier, attention_out_multiplier, ssm_in_multiplier,
        ssm_out_multiplier))

  def init_mixer_cache(self, batch_size, max_len, dtype):
    return {"attention": self.self_attn.init_mixer_cache(batch_size, max_len,
                                                         dtype),
            "mamba": self.mamba.init_mixer_cache(batch_size, max_len, dtype)}

  def recurrent_state_floats(self, seq_len):
    """The attention's KV cache plus Mamba-2's state."""
    return (self.self_attn.recurrent_state_floats(seq_len)
            + self.mamba.recurrent_state_floats(seq_len))

  def conv_state_floats(self):
    return self.mamba.conv_state_floats()

  def mix(self, x, ctx: Context):
    attn_in, attn_out, ssm_in, ssm_out = self.multipliers
    cache = ctx.cache

    def part(name):
      return dataclasses.replace(ctx, cache=None if cache is None
                                 else cache[name])

    # y = m_ao attn(m_ai x) + m_so mamba2(m_si x)
    y_attn, attn_cache = self.self_attn.mix(x * attn_in, part("attention"))
    y_ssm, ssm_cache = self.mamba.mix(x * ssm_in, part("mamba"))
    y = y_attn * attn_out + y_ssm * ssm_out                     # [B, T, D]
    if cache is None:
      return y, None
    return y, {"attention": attn_cache, "mamba": ssm_cache}
