"""Comba (Hu et al. 2025, https://arxiv.org/abs/2506.02475).

    q, k, v = silu(short_conv(x W_{q,k,v}))
    p = sigmoid(d) * k                         the erase key (inner decay d)
    q <- q - D * p                             the output correction
    beta = sigmoid(x W_b)       g = -exp(A_log) * softplus(x W_a + dt_bias)
    S_t = (exp(g_t) I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (q_t / sqrt(K))                q, k, p L2-normalised by the op
    y = W_o (rms_norm(o) * sigmoid(x W_g))

flash-linear-attention's ``layers/comba.py`` (``Comba``). The cache is
``{"conv": the windows of the three short convolutions, "state": the [B,
HV, K, V] float32 state}``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, OpForms
from lin_attn_jax.layers.deltanet import GatedDeltaNet
from lin_attn_jax.ops import (chunk_comba, comba_step, parallel_comba,
                              recurrent_comba)

_F32 = jnp.float32
COMBA_FORMS = OpForms(chunk_comba, parallel_comba, recurrent_comba,
                      comba_step)


class Comba(GatedDeltaNet):
  """Comba: Gated DeltaNet's layer with a scalar-plus-low-rank transition
  and an output correction (flash-linear-attention's ``Comba``).

  The reference's projections, gates and norm: q, k, v projections (no
  bias) through silu short convolutions (``silu(x W)`` without them); the
  erase key ``p = sigmoid(d) k`` with ``d`` one parameter per query/key
  head (``use_inner_decay``; ``p = k`` without); the output correction ``q
  <- q - D p`` with ``D`` one parameter per query/key head
  (``use_output_correction``, ``D`` starts at ``correction_factor``); the
  writing strength ``beta = sigmoid(x W_b)`` and Gated DeltaNet's decay
  ``g = -exp(A_log) softplus(x W_a + dt_bias)``, both per value head; the
  op ``chunk_comba`` and its siblings, which L2-normalise q, k and p and
  read the state along p before the decay; the output ``W_o (rms_norm(o) *
  sigmoid(x W_g))`` (a sigmoid gate, fla's ``FusedRMSNormGated(...,
  activation='sigmoid')``), or ``W_o rms_norm(o)`` without the output gate.

  Since the op normalises p, the inner decay reaches the output only
  through the correction (``q - D sigmoid(d) k`` before q is normalised);
  it is kept for checkpoints, as in the reference.

  Defaults are fla's layer's (``expand_k`` 0.75 and ``expand_v`` 1.5:
  fla's ``head_dim`` 256 and ``expand_v`` 2 with 6 heads at ``D = 2048``;
  ``d`` ones; ``D`` ones (``correction_factor`` 1, fla warns that 0.02 is
  sometimes better for small models); short convolutions of 4 taps without
  bias; ``norm_eps=1e-5``; the gate on), with the initialisation of
  ``GatedDeltaNet``, whose docstring says where and why it departs from the
  reference's: ``W_g`` from zero (here the sigmoid gate then starts at 1/2
  everywhere, not as a random factor per token and channel), ``A ~ U(1,
  16)`` (fla ``U(0, 16)``), LeCun normal projections (fla's models
  ``N(0, 0.02)``). fla's model passes only ``use_output_gate``,
  ``use_short_conv``, ``conv_size`` and ``norm_eps`` to its layers: a
  checkpoint always has the inner decay and the correction.

  Args:
    d_model: ``D``. n_heads: ``H``.
    expand_k, expand_v: key and value widths per head, ``expand * D / H``.
    use_inner_decay: the erase key ``sigmoid(d) k`` (True).
    use_output_correction: ``q - D p`` (True).
    correction_factor: the initial ``D`` (1.0).
    use_short_conv, conv_size, conv_bias, use_output_gate, allow_neg_eigval,
      norm_eps, n_v_heads, head_k_dim, head_v_dim, chunk_size, impl,
      zero_init_gate: as in ``GatedDeltaNet`` (``allow_neg_eigval`` False,
      as fla's Comba, which has no such option).
  """

  no_weight_decay = ("A_log", "dt_bias", "D")

  @property
  def forms(self) -> OpForms:
    return COMBA_FORMS

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               expand_k: float = 0.75, expand_v: float = 1.5,
               use_inner_decay: bool = True,
               use_output_correction: bool = True,
               correction_factor: float = 1.0, use_short_conv: bool = True,
               conv_size: int = 4, conv_bias: bool = False,
               use_output_gate: bool = True, allow_neg_eigval: bool = False,
               norm_eps: float = 1e-5, n_v_heads: int | None = None,
               head_k_dim: int | None = None, head_v_dim: int | None = None,
               chunk_size: int | None = None, impl: str = "auto",
               zero_init_gate: bool = True, dtype=_F32, param_dtype=_F32):
    super().__init__(d_model, n_heads, rngs=rngs, expand_k=expand_k,
                     expand_v=expand_v, use_short_conv=use_short_conv,
                     conv_size=conv_size, conv_bias=conv_bias,
                     use_output_gate=use_output_gate,
                     allow_neg_eigval=allow_neg_eigval, norm_eps=norm_eps,
                     n_v_heads=n_v_heads, head_k_dim=head_k_dim,
                     head_v_dim=head_v_dim, chunk_size=chunk_size, impl=impl,
                     zero_init_gate=zero_init_gate, dtype=dtype,
                     param_dtype=param_dtype)
    self.use_inner_decay = use_inner_decay
    self.use_output_correction = use_output_correction
    self.decay = (modules.param(rngs, nnx.initializers.ones_init(),
                                (n_heads,), ("heads",), param_dtype)
                  if use_inner_decay else None)
    self.D = (modules.param(rngs, modules.constant_init(correction_factor),
                            (n_heads,), ("heads",), param_dtype)
              if use_output_correction else None)

  def gated_norm(self, o, x):
    """``rms_norm(o) * sigmoid(x W_g)`` (or ``rms_norm(o)``): ``[B, T, HV,
    V] -> [B, T, HV V]``."""
    if self.g_proj is None:
      return self.norm(o)
    gate = jax.nn.sigmoid(self.g_proj(x).astype(_F32))
    return (self.norm(o).astype(_F32) * gate).astype(o.dtype)   # [B,T,HV*V]

  def mix(self, x, ctx: Context):
    (q, k, v), conv, cache = self.heads(x, ctx, silu_without_conv=True)
    p = k
    if self.decay is not None:
      p = k * jax.nn.sigmoid(self.decay[...])[:, None].astype(k.dtype)
    if self.D is not None:
      q = q - self.D[...][:, None].astype(q.dtype) * p          # [B, T, H, K]
    # S_t = (exp(g_t) I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T
    # o_t = S_t^T q_t / sqrt(K), q, k and p L2-normalised by the op
    o, state = self.apply_forms(
        ctx, COMBA_FORMS,
        dict(q=q, k=k, v=v, p=p, g=self.log_decay(x), beta=self.beta(x)),
        cache, use_qk_l2norm=True)                              # [B, T, HV, V]
    y = self.o_proj(self.gated_norm(o, x))                      # [B, T, D]
    return y, self.joined_cache(conv, state)
