"""Delta-rule layers: DeltaNet, Gated DeltaNet and Kimi Delta Attention.

All three share one skeleton: ``q, k, v = silu(short_conv(x W))`` (a causal
depthwise convolution of 4 taps on each, ``modules.QKVShortConv``; off with
``use_short_conv=False``, as in the references), q and k L2-normalised
inside the op, a writing strength ``beta = sigmoid(x W_b)`` per head, the
delta rule

    S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (q_t / sqrt(K))

and ``W_o norm(o)`` with a per-head RMSNorm. They differ in the decay
``g_t`` and the output gate:

- DeltaNet (Yang et al. 2024, https://arxiv.org/abs/2406.06484): no decay,
  optional silu output gate;
- Gated DeltaNet (Yang, Kautz, Hatamizadeh 2025,
  https://arxiv.org/abs/2412.06464): a scalar decay per head
  ``g = -exp(A_log) * softplus(x W_a + dt_bias)`` as in Mamba-2, and a gated
  RMSNorm ``rms_norm(o) * silu(x W_g)``;
- KDA (Kimi Team 2025, "Kimi Linear", https://arxiv.org/abs/2510.26692): the
  same decay per key channel from a low-rank projection, and a low-rank
  sigmoid output gate after the RMSNorm.

The layers call the core's forms (``chunk_delta_rule`` and its siblings)
directly: the ``gated_delta_rule`` and ``kda`` ops are those forms with a
scalar or a per-channel ``g``. The cache is ``{"conv": the last
``conv_size - 1`` inputs of each of the three convolutions, "state": the
[B, H, K, V] float32 state}`` (``Mixer.with_conv_cache``).

Dense projections use the package's LeCun normal init (the papers do not fix
one), the convolutions PyTorch's ``Conv1d`` init without bias as in the
papers' code; ``A_log`` and ``dt_bias`` follow the references named in each
class.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import (Context, Mixer, OpForms, checked_impl,
                                      zero_state)
from lin_attn_jax.ops import (chunk_delta_rule, delta_rule_step,
                              parallel_delta_rule, recurrent_delta_rule)
from lin_attn_jax.ops.common import checks

_F32 = jnp.float32
# The gated_delta_rule and kda ops are these forms with a scalar or a
# per-channel g.
DELTA_RULE_FORMS = OpForms(chunk_delta_rule, parallel_delta_rule,
                           recurrent_delta_rule, delta_rule_step)


def head_dims(d_model: int, n_heads: int, expand_k: float, expand_v: float):
  """Key and value widths per head, ``expand * d_model / n_heads``."""
  key_dim, value_dim = d_model * expand_k, d_model * expand_v
  if (key_dim != int(key_dim) or value_dim != int(value_dim)
      or int(key_dim) % n_heads or int(value_dim) % n_heads
      or key_dim < n_heads or value_dim < n_heads):
    raise ValueError(f"expand_k * d_model = {key_dim} and expand_v * d_model "
                     f"= {value_dim} must be whole multiples of n_heads = "
                     f"{n_heads}")
  return int(key_dim) // n_heads, int(value_dim) // n_heads


def a_log_init(low: float = 1.0, high: float = 16.0):
  """An initializer of ``A_log = log(A)`` with ``A ~ U(low, high)``."""

  def init(key, shape, dtype=_F32):
    return jnp.log(jax.random.uniform(key, shape, _F32, low, high)).astype(
        dtype)

  return init


def mamba2_decay_params(rngs: nnx.Rngs, shape, *, dt_min=1e-3, dt_max=0.1,
                        dt_floor=1e-4, param_dtype=_F32):
  """``A_log`` and ``dt_bias`` initialised as in Mamba-2.

  ``A ~ U(1, 16)``, ``A_log = log(A)``; ``dt`` log-uniform in ``[dt_min,
  dt_max]`` (at least ``dt_floor``) and ``dt_bias = softplus^-1(dt)``.
  """

  def dt_bias_init(key, shape, dtype=_F32):
    u = jax.random.uniform(key, shape, _F32)
    dt = jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = jnp.maximum(dt, dt_floor)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)        # softplus^-1

  return (modules.param(rngs, a_log_init(), shape, ("heads",), param_dtype),
          modules.param(rngs, dt_bias_init, shape, ("heads",), param_dtype))


class DeltaNet(Mixer):
  """DeltaNet (Yang et al. 2024, https://arxiv.org/abs/2406.06484).

  ``q, k, v = silu(short_conv(x W_{q,k,v}))``, L2-normalised q and k,
  ``beta = sigmoid(x W_b)`` per head, the delta rule without decay, and
  ``W_o rms_norm(o)`` per head (``rms_norm(o) * silu(x W_g)`` with
  ``use_output_gate``).

  Args:
    d_model: ``D``. n_heads: ``H``.
    expand_k: key width per head is ``expand_k * D / H`` (1.0).
    expand_v: value width per head is ``expand_v * D / H`` (1.0).
    use_short_conv: the short convolutions of q, k and v (True, as the
      references; fla warns that the layer is weaker without them).
    conv_size: taps of the short convolutions (4).
    conv_bias: the short convolutions have a bias (False).
    use_output_gate: gate the normalised output with ``silu(x W_g)``
      (False, as in the paper's models).
    zero_init_gate: start ``W_g`` at zero (True), so that the layer's output
      starts at zero and the gate grows from the readout's gradient (see
      ``GatedDeltaNet``); False draws it LeCun normal like the other
      projections.
    allow_neg_eigval: ``beta = 2 sigmoid(.)`` in (0, 2), so that the
      transition may have a negative eigenvalue (Grazzi et al.,
      https://arxiv.org/abs/2411.12537); False keeps (0, 1).
    norm_eps: epsilon of the per-head RMSNorm (1e-5).
    n_v_heads: ``HV``, value heads (and heads of ``beta``, the decay, the
      norm and the state), a multiple of ``H``; value head ``j`` reads
      query/key head ``j // (HV / H)`` (Qwen3-Next's grouped heads). None
      for ``H``.
    head_k_dim, head_v_dim: explicit key and value widths per head; they
      replace ``expand_k`` and ``expand_v`` (None: from those).
    chunk_size: chunk length of the chunk form (speed only); None: 16
      on CPU, 64 on TPU/GPU (``base.resolved_chunk_size``).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the chunk form's
      implementation (``lin_attn_jax.ops.common.dispatch``).
  """

  @property
  def forms(self) -> OpForms:
    """The op's forms that ``mix`` runs."""
    return DELTA_RULE_FORMS

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               expand_k: float = 1.0, expand_v: float = 1.0,
               use_short_conv: bool = True, conv_size: int = 4,
               conv_bias: bool = False, use_output_gate: bool = False,
               allow_neg_eigval: bool = False, norm_eps: float = 1e-5,
               n_v_heads: int | None = None, head_k_dim: int | None = None,
               head_v_dim: int | None = None, chunk_size: int | None = None,
               impl: str = "auto", zero_init_gate: bool = True,
               dtype=_F32, param_dtype=_F32):
    key_dim, value_dim = self.init_heads(
        d_model, n_heads, expand_k=expand_k, expand_v=expand_v,
        n_v_heads=n_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim,
        chunk_size=chunk_size, impl=impl, allow_neg_eigval=allow_neg_eigval)
    self.zero_init_gate = zero_init_gate
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.init_qkv(d_model, key_dim, value_dim, use_short_conv=use_short_conv,
                  conv_size=conv_size, conv_bias=conv_bias, **kw)
    self.b_proj = modules.dense(d_model, self.n_v_heads, **kw)
    self.init_decay(d_model, **kw)
    self.init_output_gate(d_model, use_output_gate, **kw)
    self.init_readout(d_model, norm_eps, **kw)

  def init_heads(self, d_model, n_heads, *, expand_k, expand_v, n_v_heads,
                 head_k_dim, head_v_dim, chunk_size, impl, allow_neg_eigval):
    """Checks and sets the heads, their widths, ``chunk_size``, ``impl``
    and ``allow_neg_eigval`` (arguments as in ``DeltaNet``); returns
    ``(key_dim, value_dim) = (H K, HV V)``."""
    for name, value in (("n_v_heads", n_v_heads), ("head_k_dim", head_k_dim),
                        ("head_v_dim", head_v_dim)):
      checks.positive_int(name, value, allow_none=True)
    if head_k_dim is None or head_v_dim is None:
      self.head_k, self.head_v = head_dims(d_model, n_heads, expand_k,
                                           expand_v)
    self.head_k = self.head_k if head_k_dim is None else head_k_dim
    self.head_v = self.head_v if head_v_dim is None else head_v_dim
    n_v_heads = n_heads if n_v_heads is None else n_v_heads
    if n_v_heads % n_heads:
      raise ValueError(f"n_v_heads = {n_v_heads} must be a multiple of "
                       f"n_heads = {n_heads}")
    self.n_heads, self.n_v_heads = n_heads, n_v_heads
    self.chunk_size = chunk_size
    self.impl = checked_impl(impl)
    self.allow_neg_eigval = allow_neg_eigval
    return n_heads * self.head_k, n_v_heads * self.head_v

  def init_qkv(self, d_model, key_dim, value_dim, *, use_short_conv,
               conv_size, conv_bias, rngs, dtype, param_dtype, copies=1):
    """Creates ``q_proj: D -> key_dim``, ``k_proj: D -> copies key_dim``,
    ``v_proj: D -> copies value_dim`` and their short convolutions."""
    checks.positive_int("conv_size", conv_size)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, key_dim, **kw)
    self.k_proj = modules.dense(d_model, copies * key_dim, **kw)
    self.v_proj = modules.dense(d_model, copies * value_dim, **kw)
    self.short_conv = modules.qkv_short_conv(
        use_short_conv, (key_dim, copies * key_dim, copies * value_dim),
        conv_size, conv_bias, rngs=rngs, param_dtype=param_dtype)

  def init_readout(self, d_model, norm_eps, *, rngs, dtype, param_dtype):
    """Creates the per-head RMSNorm of the ``HV`` heads and ``o_proj: HV V
    -> D``."""
    self.norm = modules.HeadNorm(self.n_v_heads, self.head_v, rngs=rngs,
                                 eps=norm_eps, param_dtype=param_dtype)
    self.o_proj = modules.dense(self.n_v_heads * self.head_v, d_model,
                                ("heads", "embed"), rngs=rngs, dtype=dtype,
                                param_dtype=param_dtype)

  def init_decay(self, d_model, *, rngs, dtype, param_dtype):
    """Creates the decay's parameters (DeltaNet has none)."""
    del d_model, rngs, dtype, param_dtype

  def init_output_gate(self, d_model, use_output_gate, *, rngs, dtype,
                       param_dtype):
    """Creates the output gate's projection (``None`` without a gate)."""
    kernel_init = (nnx.initializers.zeros_init() if self.zero_init_gate
                   else None)
    self.g_proj = (modules.dense(d_model, self.n_v_heads * self.head_v,
                                 rngs=rngs, dtype=dtype,
                                 param_dtype=param_dtype,
                                 kernel_init=kernel_init)
                   if use_output_gate else None)

  def log_decay(self, x):
    """The log-decay ``g`` of every token: None (no decay)."""
    del x

  def gated_norm(self, o, x):
    """``norm(o)`` with the output gate: ``[B, T, H, V] -> [B, T, H * V]``."""
    return self.norm(o, None if self.g_proj is None else self.g_proj(x))

  def op_gates(self, x):
    """The op's per-token inputs besides q, k and v, by argument name of
    ``forms``."""
    return dict(beta=self.beta(x), g=self.log_decay(x))

  def beta(self, x):
    """Writing strength ``[B, T, HV]`` float32, in (0, 1) (or (0, 2))."""
    beta = jax.nn.sigmoid(self.b_proj(x).astype(_F32))
    return 2.0 * beta if self.allow_neg_eigval else beta

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return self.with_conv_cache(batch_size, zero_state(
        batch_size, self.n_v_heads, self.head_k, self.head_v))

  def recurrent_state_floats(self, seq_len):
    """``HV x K x V``."""
    del seq_len
    return self.n_v_heads * self.head_k * self.head_v

  def heads(self, x, ctx: Context, *, silu_without_conv: bool = False,
            per_token: int | None = None):
    """``((q, k, v), windows, own cache)``: the projections of ``x``
    through the short convolutions (``short_convolved``; SiLU instead,
    where the mixer has none and ``silu_without_conv``), split into heads:
    ``q [B, T, H, K]``, ``k [B, T, H, K]``, ``v [B, T, HV, V]``, or with
    ``per_token = N`` keys and values ``[B, T, N, H, K]`` and ``[B, T, N,
    HV, V]``."""
    b, t, _ = x.shape
    (q, k, v), conv, cache = self.short_convolved(
        self.q_proj(x), self.k_proj(x), self.v_proj(x), ctx)
    if silu_without_conv and self.short_conv is None:
      q, k, v = jax.nn.silu(q), jax.nn.silu(k), jax.nn.silu(v)
    n = () if per_token is None else (per_token,)
    q = q.reshape(b, t, self.n_heads, self.head_k)
    k = k.reshape(b, t, *n, self.n_heads, self.head_k)
    v = v.reshape(b, t, *n, self.n_v_heads, self.head_v)
    return (q, k, v), conv, cache

  def mix(self, x, ctx: Context):
    (q, k, v), conv, cache = self.heads(x, ctx)
    # S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
    # o_t = S_t^T q_t / sqrt(K), q and k L2-normalised by the op
    o, state = self.apply_forms(
        ctx, self.forms, dict(q=q, k=k, v=v, **self.op_gates(x)), cache,
        use_qk_l2norm=True)                                     # [B, T, HV, V]
    y = self.o_proj(self.gated_norm(o, x))                      # [B, T, D]
    return y, self.joined_cache(conv, state)


class GatedDeltaNet(DeltaNet):
  """Gated DeltaNet (Yang, Kautz, Hatamizadeh 2025,
  https://arxiv.org/abs/2412.06464).

  DeltaNet plus a scalar decay per head, ``g = -exp(A_log) * softplus(x W_a
  + dt_bias)`` (Mamba-2's parameterisation and init: ``A ~ U(1, 16)``,
  ``dt`` log-uniform in [1e-3, 0.1]), and the output through a gated
  RMSNorm, ``W_o (rms_norm(o) * silu(x W_g))``.

  ``W_g`` starts at zero (``zero_init_gate``), so the layer's output starts
  at zero and the gate grows from the readout's gradient (``silu'(0) =
  1/2``). Drawn LeCun normal like the other projections, the gate starts as
  a unit-scale, zero-mean random factor ``silu(x W_g)`` per token and
  channel on the recalled values, and small LMs then fail to learn
  multi-query associative recall: with 2 layers of width 64 (the issue's
  run) this layer stayed at 5% accuracy where it reached 93% without the
  gate and 95% with the gate from zero; with 2 layers of width 32 and no
  MLP (``tests/layers/test_recall.py``) 7% against 97% from zero, and DeltaNet
  with the LeCun-drawn gate 7% against 98% without it (in the width-64
  run DeltaNet learned with it, 98%). The references
  draw every projection ``N(0, 0.02)`` (flash-linear-attention's
  ``_init_weights`` and the Qwen3-Next model in transformers, both with
  ``initializer_range = 0.02``), which is about the LeCun scale at ``D =
  2048`` and only partly removes the trap at small widths (86% and 37% in
  the two runs above). The other defaults match flash-linear-attention's
  layer except ``A ~ U(1, 16)`` (Mamba-2's range; the references draw
  ``U(0, 16)``, and Qwen3-Next starts ``dt_bias`` at 1), the short
  convolutions (PyTorch's ``Conv1d`` init against ``N(0, 0.02)``) and the
  other projections (LeCun normal against ``N(0, 0.02)``); drawing all of
  them as the references do on top of the ``N(0, 0.02)`` gate gave 35% in
  the width-32 run.

  Args:
    d_model: ``D``. n_heads: ``H``.
    expand_k: key width per head is ``expand_k * D / H`` (0.75).
    expand_v: value width per head is ``expand_v * D / H`` (1.5); the
      defaults are the paper's 1.3B shape (6 heads of 256 keys and 512
      values at ``D = 2048``).
    use_short_conv, conv_size, conv_bias, allow_neg_eigval, norm_eps,
      n_v_heads, head_k_dim,
      head_v_dim, chunk_size, impl: as in ``DeltaNet``.
    use_output_gate: the gated RMSNorm (True).
    zero_init_gate: start ``W_g`` at zero (True); False draws it LeCun
      normal.
  """

  no_weight_decay = ("A_log", "dt_bias")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               expand_k: float = 0.75, expand_v: float = 1.5,
               use_short_conv: bool = True, conv_size: int = 4,
               conv_bias: bool = False, use_output_gate: bool = True,
               allow_neg_eigval: bool = False, norm_eps: float = 1e-5,
               n_v_heads: int | None = None, head_k_dim: int | None = None,
               head_v_dim: int | None = None, chunk_size: int | None = None,
               impl: str = "auto", zero_init_gate: bool = True,
               dtype=_F32, param_dtype=_F32):
    super().__init__(d_model, n_heads, rngs=rngs, expand_k=expand_k,
                     expand_v=expand_v, use_short_conv=use_short_conv,
                     conv_size=conv_size, conv_bias=conv_bias,
                     use_output_gate=use_output_gate,
                     allow_neg_eigval=allow_neg_eigval, norm_eps=norm_eps,
                     n_v_heads=n_v_heads, head_k_dim=head_k_dim,
                     head_v_dim=head_v_dim, chunk_size=chunk_size, impl=impl,
                     zero_init_gate=zero_init_gate, dtype=dtype,
                     param_dtype=param_dtype)

  def init_decay(self, d_model, *, rngs, dtype, param_dtype):
    self.a_proj = modules.dense(d_model, self.n_v_heads, rngs=rngs,
                                dtype=dtype, param_dtype=param_dtype)
    self.A_log, self.dt_bias = mamba2_decay_params(
        rngs, (self.n_v_heads,), param_dtype=param_dtype)

  def log_decay(self, x):
    """``[B, T, HV]`` float32, ``<= 0``."""
    dt = jax.nn.softplus(self.a_proj(x).astype(_F32)
                         + self.dt_bias[...].astype(_F32))
    return -jnp.exp(self.A_log[...].astype(_F32)) * dt          # [B, T, H]


class KDA(DeltaNet):
  """Kimi Delta Attention (Kimi Team 2025, "Kimi Linear",
  https://arxiv.org/abs/2510.26692).

  Gated DeltaNet with a decay per key channel from a low-rank projection,
  ``g = -exp(A_log) * softplus(f_up(f_down(x)) + dt_bias)`` of shape
  ``[B, T, H, K]`` (``A_log`` per head, ``A ~ U(1, 16)``; ``dt_bias`` per
  key channel, zeros; as in the paper's code), and a low-rank sigmoid output
  gate, ``W_o (rms_norm(o) * sigmoid(g_up(g_down(x))))`` (``g_up`` with a
  bias unless ``gate_bias=False``). Both low ranks are the value width of a
  head.

  Args:
    d_model: ``D``. n_heads: ``H``.
    expand_k, expand_v: key and value widths per head are ``expand * D / H``
      (1.0 each).
    use_short_conv, conv_size, conv_bias, allow_neg_eigval, norm_eps,
      head_k_dim, head_v_dim, impl: as in ``DeltaNet``.
    gate_bias: ``g_up`` has a bias (True, as the paper's code; transformers'
      ``KimiLinearDeltaAttention.g_b_proj`` has none).
    chunk_size: as in ``DeltaNet`` (None: 16 on CPU, where longer chunks
      compile slower, see docs/performance.md).
  """

  no_weight_decay = ("A_log", "dt_bias")
  dt_bias_init = staticmethod(nnx.initializers.zeros_init())
  # g_up has a bias (subclasses that do not take the option keep it).
  gate_bias = True

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               expand_k: float = 1.0, expand_v: float = 1.0,
               use_short_conv: bool = True, conv_size: int = 4,
               conv_bias: bool = False, allow_neg_eigval: bool = False,
               norm_eps: float = 1e-5, head_k_dim: int | None = None,
               head_v_dim: int | None = None, gate_bias: bool = True,
               chunk_size: int | None = None, impl: str = "auto",
               dtype=_F32, param_dtype=_F32):
    self.gate_bias = gate_bias
    super().__init__(d_model, n_heads, rngs=rngs, expand_k=expand_k,
                     expand_v=expand_v, use_short_conv=use_short_conv,
                     conv_size=conv_size, conv_bias=conv_bias,
                     use_output_gate=True, allow_neg_eigval=allow_neg_eigval,
                     norm_eps=norm_eps, head_k_dim=head_k_dim,
                     head_v_dim=head_v_dim, chunk_size=chunk_size, impl=impl,
                     dtype=dtype, param_dtype=param_dtype)

  def init_decay(self, d_model, *, rngs, dtype, param_dtype):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    key_dim = self.n_heads * self.head_k
    self.f_down = modules.dense(d_model, self.head_v, ("embed", "rank"), **kw)
    self.f_up = modules.dense(self.head_v, key_dim, ("rank", "heads"), **kw)
    self.A_log = modules.param(rngs, a_log_init(), (self.n_heads,),
                               ("heads",), param_dtype)
    self.dt_bias = modules.param(rngs, self.dt_bias_init, (key_dim,),
                                 ("heads",), param_dtype)

  def init_output_gate(self, d_model, use_output_gate, *, rngs, dtype,
                       param_dtype):
    del use_output_gate
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.g_down = modules.dense(d_model, self.head_v, ("embed", "rank"), **kw)
    self.g_up = modules.dense(self.head_v, self.n_v_heads * self.head_v,
                              ("rank", "heads"), use_bias=self.gate_bias,
                              **kw)

  def log_decay(self, x):
    """``[B, T, H, K]`` float32, ``<= 0``."""
    b, t, _ = x.shape
    f = self.f_up(self.f_down(x)).astype(_F32) + self.dt_bias[...].astype(_F32)
    f = jax.nn.softplus(f).reshape(b, t, self.n_heads, self.head_k)
    return -jnp.exp(self.A_log[...].astype(_F32))[:, None] * f  # [B, T, H, K]

  def gated_norm(self, o, x):
    gate = jax.nn.sigmoid(self.g_up(self.g_down(x)).astype(_F32))
    return (self.norm(o).astype(_F32) * gate).astype(o.dtype)   # [B, T, H*V]
