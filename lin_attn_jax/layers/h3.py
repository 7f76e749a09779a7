"""H3, Hungry Hungry Hippos (Fu et al., 2023, arXiv:2212.14052).

``q, k, v = x W_q, x W_k, x W_v``; the shift SSM runs over every channel of
``k``; the channels are split into heads of ``d_h = head_dim``; per head the
outer product of the shifted keys and the values, ``kv_t = shift(k)_t
v_t^T`` (``[d_h, d_h]``), goes through a diagonal SSM (S4D) of each of its
``d_h^2`` entries with the head's parameters; the output is ``o_t = q_t^T
kv'_t`` per head, then ``o W_o``. With ``d_h = 1`` (the reference's default,
that of its released models) this is ``q * S4D(shift(k) * v)`` per channel,
with one S4D per channel.

Letters: b batch, t time, h head, k and v the key and value channels of a
head (``K = V = d_h``), e the ``d_h^2`` entries of a head's ``kv``.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms
from lin_attn_jax.ops import (chunk_s4d, chunk_shift_ssm, parallel_s4d,
                              parallel_shift_ssm, recurrent_s4d,
                              recurrent_shift_ssm, s4d_step, shift_ssm_step)
from lin_attn_jax.ops.conv import MAX_WIDTH

SHIFT_SSM_FORMS = OpForms(chunk_shift_ssm, parallel_shift_ssm,
                          recurrent_shift_ssm, shift_ssm_step)
S4D_FORMS = OpForms(chunk_s4d, parallel_s4d, recurrent_s4d, s4d_step)


class H3(Mixer):
  """H3: ``q * S4D(shift_ssm(k) v^T)`` per head of ``head_dim`` channels.

  Forms of the two SSMs per mode: ``"chunk"``, both chunk forms (S4D's is
  ``chunk_s4d``: Toeplitz matmuls inside chunks and its state between
  them, where the reference uses an FFT convolution); ``"parallel"``, both
  parallel forms; ``"recurrent"``, both scans; decoding, both step forms.

  The S4D state holds ``d_state / 2`` complex modes for each of the ``D
  d_h`` entries of the heads' ``kv``: ``d_h`` times the width of the model.
  ``head_dim=1`` (the default, as in the reference and its released models)
  keeps it ``D d_state``; ``head_dim=None`` takes ``D / n_heads`` (the
  reference's multi-head H3), whose state and work grow with ``D^2 /
  n_heads``.

  Initialisation as in the paper's reference: the shift SSM's taps ``C`` and
  skip standard normal per channel; S4D-Lin per head (Gu et al. 2022,
  arXiv:2206.11893): ``A_n = -1/2 + i pi n`` for the ``d_state / 2``
  complex modes (the real part stored as ``log(1/2)`` and read as
  ``-exp``, so it stays negative), ``B = 1``, ``C`` complex standard normal
  (variance 1/2 per part), the step ``dt`` log-uniform in ``[dt_min,
  dt_max]``, the skip ``D`` standard normal; projections LeCun normal with
  zero biases.

  Args:
    d_model: ``D``. n_heads: used only with ``head_dim=None``.
    head_dim: ``d_h``, channels per head (1); the layer has ``H = D / d_h``
      heads, each with its own S4D parameters. None means ``D / n_heads``.
    d_state: real state size of S4D per channel, even: ``d_state / 2``
      complex modes in conjugate pairs (64).
    shift_size: state size (taps) of the shift SSM, 2 to 64 (64).
    dt_min, dt_max: range of S4D's initial time step (1e-3, 1e-1).
    bias: the projections have biases (True).
    chunk_size: chunk length of the chunk forms (speed only).

  Cache: ``{"shift": [B, shift_size - 1, D], "s4d": [B, d_h^2, H, d_state /
  2, 2]}`` float32 (the last keys, and the complex S4D states as real and
  imaginary parts).
  """

  no_weight_decay = ("shift_C", "shift_D", "log_dt", "log_A_real", "A_imag",
                     "B", "C", "D")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               head_dim: int | None = 1, d_state: int = 64,
               shift_size: int = 64, dt_min: float = 1e-3,
               dt_max: float = 1e-1, bias: bool = True, chunk_size: int = 64,
               dtype=jnp.float32, param_dtype=jnp.float32):
    if head_dim is None:
      if n_heads < 1 or d_model % n_heads:
        raise ValueError(f"d_model = {d_model} must divide into n_heads = "
                         f"{n_heads}")
      head_dim = d_model // n_heads
    if not isinstance(head_dim, int) or head_dim < 1 or d_model % head_dim:
      raise ValueError(f"head_dim must be a positive int dividing d_model = "
                       f"{d_model}, got {head_dim!r}")
    n_heads = d_model // head_dim
    if d_state < 2 or d_state % 2:
      raise ValueError(f"d_state must be even and >= 2 (complex modes come "
                       f"in conjugate pairs), got {d_state}")
    if not 2 <= shift_size <= MAX_WIDTH:
      raise ValueError(f"shift_size must be in [2, {MAX_WIDTH}], got "
                       f"{shift_size}")
    if not 0 < dt_min <= dt_max:
      raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min = {dt_min}, "
                       f"dt_max = {dt_max}")
    self.n_heads, self.head_dim = n_heads, head_dim
    self.modes, self.shift_size = d_state // 2, shift_size
    self.chunk_size = chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, d_model, use_bias=bias, **kw)
    self.k_proj = modules.dense(d_model, d_model, use_bias=bias, **kw)
    self.v_proj = modules.dense(d_model, d_model, use_bias=bias, **kw)
    normal = nnx.initializers.normal(1.0)
    self.shift_C = modules.param(rngs, normal, (d_model, shift_size),
                                 ("heads", "state"), param_dtype)
    self.shift_D = modules.param(rngs, normal, (d_model,), ("heads",),
                                 param_dtype)
    heads_modes = (n_heads, self.modes)
    self.log_dt = modules.param(
        rngs, modules.uniform_init(math.log(dt_min), math.log(dt_max)),
        (n_heads,), ("heads",), param_dtype)
    self.log_A_real = modules.param(rngs, modules.constant_init(math.log(0.5)),
                                    heads_modes, ("heads", "state"),
                                    param_dtype)
    self.A_imag = modules.param(
        rngs, modules.constant_init(
            math.pi * jnp.arange(self.modes, dtype=jnp.float32)),
        heads_modes, ("heads", "state"), param_dtype)
    self.B = modules.param(rngs, modules.constant_init(jnp.array([1.0, 0.0])),
                           heads_modes + (2,), ("heads", "state", None),
                           param_dtype)
    self.C = modules.param(rngs, nnx.initializers.normal(math.sqrt(0.5)),
                           heads_modes + (2,), ("heads", "state", None),
                           param_dtype)
    self.D = modules.param(rngs, normal, (n_heads,), ("heads",), param_dtype)
    self.o_proj = modules.dense(d_model, d_model, ("heads", "embed"),
                                use_bias=bias, **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    d_model = self.n_heads * self.head_dim
    return {"shift": jnp.zeros((batch_size, self.shift_size - 1, d_model),
                               jnp.float32),
            "s4d": jnp.zeros((batch_size, self.head_dim ** 2, self.n_heads,
                              self.modes, 2), jnp.float32)}

  def recurrent_state_floats(self, seq_len):
    """S4D's complex modes of every entry of ``kv``: ``H d_h^2 x d_state``
    (``D x d_h x d_state``)."""
    del seq_len
    return self.n_heads * self.head_dim ** 2 * self.modes * 2

  def conv_state_floats(self):
    """The shift SSM's last ``shift_size - 1`` keys, ``(shift_size - 1) x
    D``: a convolution window, counted with ``include_conv``."""
    return (self.shift_size - 1) * self.n_heads * self.head_dim

  def _s4d_params(self):
    """S4D's parameters per head, float32: ``(log_dt [H], A_real [H, M],
    A_imag [H, M], B [H, M, 2], C [H, M, 2], D [H])``."""
    f32 = lambda p: p[...].astype(jnp.float32)  # noqa: E731
    return (f32(self.log_dt), -jnp.exp(f32(self.log_A_real)), f32(self.A_imag),
            f32(self.B), f32(self.C), f32(self.D))

  def mix(self, x, ctx: Context):
    b, t, d_model = x.shape
    h, d_h = self.n_heads, self.head_dim
    e = d_h * d_h
    cache = ctx.cache
    q = self.q_proj(x).reshape(b, t, h, d_h)               # [B, T, H, K]
    k = self.k_proj(x)                                     # [B, T, D]
    v = self.v_proj(x).reshape(b, t, h, d_h)               # [B, T, H, V]
    # o_t = q_t^T S4D(shift_ssm(k) v^T)_t per head
    k, shift_state = self.apply_forms(
        ctx, SHIFT_SSM_FORMS, dict(u=k),
        None if cache is None else cache["shift"], C=self.shift_C[...],
        D=self.shift_D[...])                               # [B, T, D]
    k = k.reshape(b, t, h, d_h)                            # [B, T, H, K]
    # S4D's channels are the heads; the d_h^2 entries of every head's kv
    # are rows of the batch (they share the head's parameters).
    if d_h == 1:
      kv = (k * v).reshape(b, t, h)                        # [B, T, H]
    else:
      kv = jnp.einsum("bthk,bthv->bkvth", k, v)            # [B, K, V, T, H]
      kv = kv.reshape(b * e, t, h)                         # [B E, T, H]
    log_dt, A_real, A_imag, B, C, D = self._s4d_params()
    state = (None if cache is None else
             cache["s4d"].reshape(b * e, h, self.modes, 2))  # [B E, H, M, 2]
    y, s4d_state = self.apply_forms(
        ctx.repeated(e), S4D_FORMS, dict(u=kv), state, log_dt=log_dt,
        A_real=A_real, A_imag=A_imag, B=B, C=C, D=D)       # [B E, T, H]
    if d_h == 1:
      o = q[..., 0] * y                                    # [B, T, H]
    else:
      y = y.reshape(b, d_h, d_h, t, h)                     # [B, K, V, T, H]
      o = jnp.einsum("bthk,bkvth->bthv", q, y)             # [B, T, H, V]
    o = self.o_proj(o.reshape(b, t, d_model))
    if cache is None:
      return o, None
    return o, {"shift": shift_state,
               "s4d": s4d_state.reshape(b, e, h, self.modes, 2)}
