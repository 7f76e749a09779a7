"""Gated DeltaProduct (Siems et al. 2025, https://arxiv.org/abs/2502.10297).

Gated DeltaNet with ``N`` keys, values and writing strengths per token
(``num_householder``): after the decay, the state takes ``N`` delta-rule
steps, a product of ``N`` generalised Householder transitions per token,
and q reads it after the last. The layer follows flash-linear-attention's
``GatedDeltaProduct`` (``fla/layers/gated_deltaproduct.py``): ``k_proj``,
``v_proj`` and ``b_proj`` are ``N`` times wider (channels ordered ``(n, h,
d)``) and so are the short convolutions of k and v; the decay and the
output gate are Gated DeltaNet's, once per token.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, OpForms
from lin_attn_jax.layers.deltanet import GatedDeltaNet
from lin_attn_jax.ops import (chunk_gated_delta_product,
                              gated_delta_product_step,
                              parallel_gated_delta_product,
                              recurrent_gated_delta_product)
from lin_attn_jax.ops.common import checks

_F32 = jnp.float32
GATED_DELTA_PRODUCT_FORMS = OpForms(chunk_gated_delta_product,
                                    parallel_gated_delta_product,
                                    recurrent_gated_delta_product,
                                    gated_delta_product_step)


class GatedDeltaProduct(GatedDeltaNet):
  """Gated DeltaProduct: ``N`` delta-rule steps per token after the decay.

  ``q = silu(conv(x W_q))`` ``[B, T, H, K]``; ``k = silu(conv(x W_k))``
  ``[B, T, N, H, K]``, ``v = silu(conv(x W_v))`` ``[B, T, N, HV, V]``,
  ``beta = sigmoid(x W_b)`` ``[B, T, N, HV]`` (times 2 with
  ``allow_neg_eigval``), q and every key L2-normalised by the op;
  ``g = -exp(A_log) softplus(x W_a + dt_bias)`` per token and value head
  (with ``use_forget_gate``); then ``S <- exp(g_t) S`` and ``N`` steps
  ``S <- S + beta_{t,j} k_{t,j} (v_{t,j} - S^T k_{t,j})^T``, ``o_t = S^T
  q_t / sqrt(K)`` and ``W_o (rms_norm(o) * silu(x W_g))``. Without short
  convolutions q, k and v are ``silu(x W)``, as in the reference.

  Defaults are fla's layer's (``num_householder=2``, ``use_forget_gate``
  and ``allow_neg_eigval`` on, the gated RMSNorm, short convolutions of 4
  taps without bias, ``norm_eps=1e-5``; fla's model config defaults to one
  step without the gate and without negative eigenvalues, which a
  converted checkpoint sets explicitly), with the initialisation of
  ``GatedDeltaNet``, whose docstring says where and why it departs from
  the reference's: ``W_g`` from zero (the output-gate trap), ``A ~ U(1,
  16)`` (fla ``U(0, 16)``), LeCun normal projections.

  Args:
    d_model: ``D``. n_heads: ``H``.
    num_householder: ``N``, delta-rule steps per token (2).
    use_forget_gate: the decay ``g`` (True); False is DeltaProduct without
      a gate.
    expand_k, expand_v: key and value widths per head, ``expand * D / H``
      (0.75 and 1.5: fla's ``head_dim`` 256 and ``expand_v`` 2 at ``D =
      2048`` with 6 heads).
    allow_neg_eigval: ``beta`` in (0, 2) (True, as fla's layer).
    use_short_conv, conv_size, conv_bias, use_output_gate, norm_eps,
      n_v_heads, head_k_dim, head_v_dim, chunk_size, impl, zero_init_gate:
      as in ``GatedDeltaNet``; ``chunk_size`` counts the op's sub-steps
      (``N`` per token).
  """

  no_weight_decay = ("A_log", "dt_bias")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               num_householder: int = 2, use_forget_gate: bool = True,
               expand_k: float = 0.75, expand_v: float = 1.5,
               use_short_conv: bool = True, conv_size: int = 4,
               conv_bias: bool = False, use_output_gate: bool = True,
               allow_neg_eigval: bool = True, norm_eps: float = 1e-5,
               n_v_heads: int | None = None, head_k_dim: int | None = None,
               head_v_dim: int | None = None, chunk_size: int | None = None,
               impl: str = "auto", zero_init_gate: bool = True,
               dtype=_F32, param_dtype=_F32):
    checks.positive_int("num_householder", num_householder)
    key_dim, value_dim = self.init_heads(
        d_model, n_heads, expand_k=expand_k, expand_v=expand_v,
        n_v_heads=n_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim,
        chunk_size=chunk_size, impl=impl, allow_neg_eigval=allow_neg_eigval)
    self.num_householder = n = num_householder
    self.use_forget_gate = use_forget_gate
    self.zero_init_gate = zero_init_gate
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.init_qkv(d_model, key_dim, value_dim, use_short_conv=use_short_conv,
                  conv_size=conv_size, conv_bias=conv_bias, copies=n, **kw)
    self.b_proj = modules.dense(d_model, n * self.n_v_heads, **kw)
    if use_forget_gate:
      self.init_decay(d_model, **kw)
    self.init_output_gate(d_model, use_output_gate, **kw)
    self.init_readout(d_model, norm_eps, **kw)

  def log_decay(self, x):
    """``[B, T, HV]`` float32 ``<= 0``, or None without the forget gate."""
    return super().log_decay(x) if self.use_forget_gate else None

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    n = self.num_householder
    (q, k, v), conv, cache = self.heads(x, ctx, silu_without_conv=True,
                                        per_token=n)
    beta = self.beta(x).reshape(b, t, n, self.n_v_heads)       # [B, T, N, HV]
    # S <- exp(g_t) S, then for j = 1..N:
    #   S <- S + beta_{t,j} k_{t,j} (v_{t,j} - S^T k_{t,j})^T
    # o_t = S^T q_t / sqrt(K), q and k L2-normalised by the op
    o, state = self.apply_forms(
        ctx, GATED_DELTA_PRODUCT_FORMS,
        dict(q=q, k=k, v=v, g=self.log_decay(x), beta=beta), cache,
        use_qk_l2norm=True)                                     # [B, T, HV, V]
    y = self.o_proj(self.gated_norm(o, x))                      # [B, T, D]
    return y, self.joined_cache(conv, state)
