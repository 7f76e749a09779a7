"""MesaNet (von Oswald et al. 2025, "MesaNet: Sequence Modeling by Locally
Optimal Test-Time Training", https://arxiv.org/abs/2506.05233), as
flash-linear-attention's ``MesaNet`` layer (``fla/layers/mesa_net.py``):

    q, k = silu(conv(x W_q)), silu(conv(x W_k))      [B, T, H, K]
    v = x W_v                                         [B, T, H, K]
    beta = sigmoid(x W_b + b_b), g = log_sigmoid(x W_a + b_a)   [B, T, H]
    lamb = softplus(lambda_params) + lambda_lower_bound          [H, K]
    o = mesa_net(l2(q), l2(k), v, g, beta, lamb)      (ops.chunk_mesa_net)
    y = W_o rms_norm(o)        (rms_norm(o) * silu(x W_g) with the gate)

Only q and k have short convolutions (no v convolution, no activation on
v), values are as wide as keys (``head_dim``), the ``[K, K]`` and ``[K,
V]`` states are the cache.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms, checked_impl
from lin_attn_jax.ops import (chunk_mesa_net, mesa_net_step, parallel_mesa_net,
                              recurrent_mesa_net)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.mesa_net.inputs import CG_STEPS
from lin_attn_jax.ops.mesa_net.step import CG_STARTS

_F32 = jnp.float32


class QKShortConv(modules.QKVShortConv):
  """The short convolutions of q and k only (fla's MesaNet has no
  ``v_conv1d``): the cached windows are ``{"q", "k"}`` and v passes
  through unchanged."""

  def __init__(self, channels, conv_size: int = 4, *, rngs: nnx.Rngs,
               activation: str | None = "silu", use_bias: bool = False,
               param_dtype=_F32):
    checks.positive_int("conv_size", conv_size)
    self.q_conv, self.k_conv = (
        modules.ShortConv(c, conv_size, rngs=rngs, activation=activation,
                          use_bias=use_bias, param_dtype=param_dtype)
        for c in channels)

  def _convs(self):
    return {"q": self.q_conv, "k": self.k_conv}

  def __call__(self, q, k, v, ctx, state=None):
    outs, new = {}, {}
    for name, x in (("q", q), ("k", k)):
      outs[name], new[name] = self._convs()[name](
          x, ctx, None if state is None else state[name])
    return (outs["q"], outs["k"], v), (None if state is None else new)


class MesaNet(Mixer):
  """MesaNet: ``o_t = H^kv_t^T (H^kk_t + diag(lamb))^{-1} q_t`` with the
  gated sums ``H^kk_t = exp(g_t) H^kk_{t-1} + beta_t k_t k_t^T`` and
  ``H^kv_t`` likewise with ``v_t``, the solve by 30 conjugate-gradient
  steps (``lin_attn_jax/ops/mesa_net``).

  Defaults are fla's layer's: ``head_dim`` 128 at fla's ``D = 2048`` with
  16 heads (here ``D / H`` when None), no output gate, short convolutions
  of 4 taps without bias, ``norm_eps=1e-5``, ``lambda_lower_bound=0.25``,
  ``lamb`` starting at 1 in every channel (``lambda_params = log(e^{0.75} -
  1)``, kept out of weight decay as fla marks it), 30 CG steps in training
  and in decoding; only the decoding start departs (``decode_cg_start``). The projections start LeCun normal with zero biases
  (fla's model draws them ``N(0, 0.02)``), as the library's other layers.

  Args:
    d_model: ``D``. n_heads: ``H``.
    head_dim: key and value width per head ``K`` (None: ``D / H``).
    use_output_gate: ``rms_norm(o) * silu(x W_g)`` (False).
    use_short_conv: the causal convolutions of q and k (True; fla's layer
      has them whatever its flag says). Without them q and k are ``silu(x
      W)``.
    conv_size, conv_bias: taps and bias of the short convolutions (4,
      False).
    norm_eps: epsilon of the per-head RMSNorm (1e-5).
    lambda_lower_bound: the floor of ``lamb`` (0.25).
    lambda_init: ``lamb`` at initialisation (1.0).
    cg_steps: CG steps of the sequence forms (30, fla's
      ``max_cg_step_training``).
    decode_cg_steps: CG steps of a decoding step (30, fla's
      ``max_cg_step_decoding``).
    decode_cg_start: ``"zeros"`` (the sequence forms' start, so that
      decoding continues a prefill to float rounding) or ``"diagonal"``
      (fla's decoding kernel's start, what a converted checkpoint uses to
      decode as its reference does). The reference's CG stops improving
      near a residual of ``sqrt(1e-5 / lamb)`` (its ``1e-5`` guards), so
      with ``"diagonal"`` decoding departs from the full forward pass by
      about 1e-3 relative in the logits of the tiny test model, as fla's
      own does; see ``ops.mesa_net_step``.
    chunk_size: chunk length of the chunk form (speed only); None: the
      backend's default (``base.resolved_chunk_size``).
    impl: the chunk form's ``impl`` (its output pass on the gated-linear
      core).
  """

  no_weight_decay = ("lambda_params",)

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               head_dim: int | None = None, use_output_gate: bool = False,
               use_short_conv: bool = True, conv_size: int = 4,
               conv_bias: bool = False, norm_eps: float = 1e-5,
               lambda_lower_bound: float = 0.25, lambda_init: float = 1.0,
               cg_steps: int = CG_STEPS, decode_cg_steps: int = CG_STEPS,
               decode_cg_start: str = "zeros",
               chunk_size: int | None = None, impl: str = "auto",
               dtype=_F32, param_dtype=_F32):
    checks.positive_int("head_dim", head_dim, allow_none=True)
    checks.positive_int("cg_steps", cg_steps)
    checks.positive_int("decode_cg_steps", decode_cg_steps)
    if head_dim is None:
      if d_model % n_heads:
        raise ValueError(f"d_model = {d_model} must be a multiple of n_heads "
                         f"= {n_heads} when head_dim is None")
      head_dim = d_model // n_heads
    if decode_cg_start not in CG_STARTS:
      raise ValueError(f"decode_cg_start must be one of {CG_STARTS}, got "
                       f"{decode_cg_start!r}")
    if lambda_init <= lambda_lower_bound:
      raise ValueError(f"lambda_init = {lambda_init} must exceed "
                       f"lambda_lower_bound = {lambda_lower_bound}")
    self.n_heads, self.head_k = n_heads, head_dim
    self.head_v = head_dim
    self.chunk_size, self.impl = chunk_size, checked_impl(impl)
    self.lambda_lower_bound = lambda_lower_bound
    self.cg_steps, self.decode_cg_steps = cg_steps, decode_cg_steps
    self.decode_cg_start = decode_cg_start
    width = n_heads * head_dim
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, width, **kw)
    self.k_proj = modules.dense(d_model, width, **kw)
    self.v_proj = modules.dense(d_model, width, **kw)
    self.a_proj = modules.dense(d_model, n_heads, use_bias=True, **kw)
    self.b_proj = modules.dense(d_model, n_heads, use_bias=True, **kw)
    self.lambda_params = modules.param(
        rngs, modules.constant_init(
            math.log(math.expm1(lambda_init - lambda_lower_bound))),
        (width,), ("heads",), param_dtype)
    checks.positive_int("conv_size", conv_size)
    self.short_conv = (QKShortConv((width, width), conv_size, rngs=rngs,
                                   use_bias=conv_bias,
                                   param_dtype=param_dtype)
                       if use_short_conv else None)
    self.g_proj = (modules.dense(d_model, width, **kw) if use_output_gate
                   else None)
    self.norm = modules.HeadNorm(n_heads, head_dim, rngs=rngs, eps=norm_eps,
                                 param_dtype=param_dtype)
    self.o_proj = modules.dense(width, d_model, ("heads", "embed"), **kw)

  def init_mixer_cache(self, batch_size: int, max_len: int, dtype):
    del max_len, dtype
    return self.with_conv_cache(batch_size, jnp.zeros(
        (batch_size, self.n_heads, self.head_k, self.head_k + self.head_v),
        _F32))

  def recurrent_state_floats(self, seq_len: int) -> int:
    """``[H^kk | H^kv]``: ``H K (K + V)``."""
    del seq_len
    return self.n_heads * self.head_k * (self.head_k + self.head_v)

  def lamb(self):
    """The regulariser ``[H, K]`` float32, ``> lambda_lower_bound``."""
    lamb = jax.nn.softplus(self.lambda_params[...].astype(_F32))
    return (lamb + self.lambda_lower_bound).reshape(self.n_heads, self.head_k)

  def forms(self) -> OpForms:
    """The op's forms with this layer's CG steps (and decoding start)."""
    def sequence(form):
      return lambda **kw: form(**kw, cg_steps=self.cg_steps)

    def step(**kw):
      return mesa_net_step(**kw, cg_steps=self.decode_cg_steps,
                           cg_start=self.decode_cg_start)

    return OpForms(sequence(chunk_mesa_net), sequence(parallel_mesa_net),
                   sequence(recurrent_mesa_net), step)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h, d = self.n_heads, self.head_k
    (q, k, v), conv, cache = self.short_convolved(
        self.q_proj(x), self.k_proj(x), self.v_proj(x), ctx)
    if self.short_conv is None:
      q, k = jax.nn.silu(q), jax.nn.silu(k)
    q, k, v = (y.reshape(b, t, h, d) for y in (q, k, v))       # [B, T, H, K]
    beta = jax.nn.sigmoid(self.b_proj(x).astype(_F32))         # [B, T, H]
    g = jax.nn.log_sigmoid(self.a_proj(x).astype(_F32))        # [B, T, H]
    # H^kk_t = exp(g_t) H^kk_{t-1} + beta_t k_t k_t^T, H^kv_t likewise,
    # o_t = H^kv_t^T (H^kk_t + diag(lamb))^{-1} q_t, q and k L2-normalised
    o, state = self.apply_forms(
        ctx, self.forms(), dict(q=q, k=k, v=v, g=g, beta=beta), cache,
        lamb=self.lamb(), use_qk_l2norm=True)                   # [B, T, H, K]
    gate = None if self.g_proj is None else self.g_proj(x)
    y = self.o_proj(self.norm(o, gate))                         # [B, T, D]
    return y, self.joined_cache(conv, state)
