"""Mamba-3 block (Lahoti et al. 2026, "Mamba-3: Improved Sequence Modeling
using State Space Principles"), SISO, on the ``mamba3`` op.

One input projection gives ``z`` and ``x`` (width ``E = expand * D``, ``H``
heads of ``P``), ``B`` and ``C`` (``G`` groups of ``N``), and per head the
time step, the decay rate and the trapezoid's ``lambda`` pre-activations,
plus ``A`` rotation rates shared by the heads. There is no short
convolution: ``B`` and ``C`` are RMS-normalised over ``N`` and get a
learnt bias per head; the op turns them by the cumulative angles and runs
the trapezoidal recurrence; the skip ``D x``, the gate ``silu(z)`` and the
output projection follow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms, checked_impl
from lin_attn_jax.layers.mamba import check_dt_range, dt_bias_init
from lin_attn_jax.ops import (chunk_mamba3, mamba3_step, parallel_mamba3,
                              recurrent_mamba3)
from lin_attn_jax.ops.mamba3.inputs import zero_state

MAMBA3_FORMS = OpForms(chunk_mamba3, parallel_mamba3, recurrent_mamba3,
                       mamba3_step)


def rope_angles(d_state: int, rope_fraction: float) -> int:
  """The reference's number of rotated pairs ``A``: ``N * rope_fraction``
  rounded down to an even number, halved."""
  split = int(d_state * rope_fraction)
  return (split - split % 2) // 2


class Mamba3(Mixer):
  """The Mamba-3 block (fla's ``layers/mamba3.py``, SISO).

  Per head ``h`` of group ``g``::

      dt = softplus(dd_dt + dt_bias),   A = min(-softplus(dd_A), -A_floor)
      k = rms_norm(B_g) + B_bias_h,      q = rms_norm(C_g) + C_bias_h
      y = mamba3(q, k, x, A dt, dt, trap, angles) + D x
      out = out_proj(y * silu(z))        (or norm(y) * silu(z) per head,
                                          with is_outproj_norm)

  Initialisation as fla's: ``dt_bias`` the inverse softplus of a time step
  drawn log-uniformly in ``[dt_min, dt_max]`` (clamped at
  ``dt_init_floor``), ``D = 1``, the biases of ``B`` and ``C`` 1, the norms'
  scales 1; projections LeCun normal (fla's model re-draws them at
  ``initializer_range``).

  Args:
    d_model: ``D``. n_heads: ``H``; with ``head_dim`` None, ``P = E / H``.
    d_state: ``N`` (128).
    expand: inner width ``E = expand * D`` (2).
    head_dim: ``P`` (None: ``E / n_heads``); given, ``E = H P``.
    n_groups: ``G``, groups of heads sharing ``B`` and ``C`` (1).
    rope_fraction: the share of ``N`` that rotates, 0.5 or 1.0 (0.5).
    dt_min, dt_max, dt_init_floor: time-step initialisation (1e-3, 1e-1,
      1e-4).
    A_floor: the decay rate's floor, ``A <= -A_floor`` (1e-4).
    is_outproj_norm: a per-head gated RMSNorm before the output
      projection instead of the plain gate (False).
    is_mimo: fla's MIMO option; only False (SISO) is implemented.
    bias: the projections have biases (False).
    norm_eps: epsilon of the norms (1e-5).
    chunk_size: chunk length of the chunk form (speed only).
    impl: the chunk form's implementation (``"auto"``, ``"xla"``,
      ``"pallas"``: the gated-linear core's kernels).

  Cache: ``[B, H, N + 1, P + 1]`` float32, the op's state.
  """

  no_weight_decay = ("dt_bias", "D")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               d_state: int = 128, expand: float = 2,
               head_dim: int | None = None, n_groups: int = 1,
               rope_fraction: float = 0.5, dt_min: float = 1e-3,
               dt_max: float = 1e-1, dt_init_floor: float = 1e-4,
               A_floor: float = 1e-4, is_outproj_norm: bool = False,
               is_mimo: bool = False, bias: bool = False,
               norm_eps: float = 1e-5, chunk_size: int = 64,
               impl: str = "auto", dtype=jnp.float32,
               param_dtype=jnp.float32):
    if is_mimo:
      raise ValueError("is_mimo=True (rank-R input and output projections "
                       "per head) is not implemented; only SISO")
    width = (int(expand * d_model) if head_dim is None
             else n_heads * head_dim)
    if n_heads < 1 or width % n_heads:
      raise ValueError(f"the inner width {width} must divide into n_heads = "
                       f"{n_heads}")
    if n_groups < 1 or n_heads % n_groups:
      raise ValueError(f"n_groups = {n_groups} must divide n_heads = "
                       f"{n_heads}")
    if rope_fraction not in (0.5, 1.0):
      raise ValueError(f"rope_fraction must be 0.5 or 1.0, got "
                       f"{rope_fraction}")
    n_angles = rope_angles(d_state, rope_fraction)
    if n_angles < 1:
      raise ValueError(f"d_state * rope_fraction = {d_state * rope_fraction}"
                       " is too small for a rotation")
    if A_floor <= 0:
      raise ValueError(f"A_floor must be > 0, got {A_floor}")
    check_dt_range(dt_min, dt_max, dt_init_floor)
    self.width, self.n_heads, self.head_dim = width, n_heads, width // n_heads
    self.d_state, self.n_groups, self.n_angles = d_state, n_groups, n_angles
    self.A_floor, self.norm_eps = A_floor, norm_eps
    self.chunk_size, self.impl = chunk_size, checked_impl(impl)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.in_proj = modules.dense(
        d_model, 2 * width + 2 * n_groups * d_state + 3 * n_heads + n_angles,
        use_bias=bias, **kw)
    self.dt_bias = modules.param(
        rngs, dt_bias_init(dt_min, dt_max, dt_init_floor), (n_heads,),
        ("heads",), param_dtype)
    ones = nnx.initializers.ones_init()
    self.B_bias = modules.param(rngs, ones, (n_heads, d_state),
                                ("heads", None), param_dtype)
    self.C_bias = modules.param(rngs, ones, (n_heads, d_state),
                                ("heads", None), param_dtype)
    self.B_norm = modules.param(rngs, ones, (d_state,), (None,), param_dtype)
    self.C_norm = modules.param(rngs, ones, (d_state,), (None,), param_dtype)
    self.D = modules.param(rngs, ones, (n_heads,), ("heads",), param_dtype)
    self.norm = (modules.HeadNorm(n_heads, self.head_dim, rngs=rngs,
                                  eps=norm_eps, param_dtype=param_dtype)
                 if is_outproj_norm else None)
    self.out_proj = modules.dense(width, d_model, ("heads", "embed"),
                                  use_bias=bias, **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return zero_state(batch_size, self.n_heads, self.d_state, self.head_dim)

  def recurrent_state_floats(self, seq_len):
    """``H (N + 1) (P + 1)``: the state, the last key and the last value."""
    del seq_len
    return self.n_heads * (self.d_state + 1) * (self.head_dim + 1)

  def _bc(self, x, scale, bias):
    """``rms_norm(x) * scale`` over ``N`` (float32), groups to heads, plus
    the per-head bias: ``[B, T, G, N] -> [B, T, H, N]``."""
    x = x.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True)
                          + self.norm_eps) * scale[...].astype(jnp.float32)
    x = jnp.repeat(x, self.n_heads // self.n_groups, axis=2)
    return x + bias[...].astype(jnp.float32)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    e, h, g, n = self.width, self.n_heads, self.n_groups, self.d_state
    z, xs, B, C, dd_dt, dd_a, trap, angles = self.in_proj.parts(
        x, [e, 2 * e, 2 * e + g * n, 2 * e + 2 * g * n, 2 * e + 2 * g * n + h,
            2 * e + 2 * g * n + 2 * h, 2 * e + 2 * g * n + 3 * h])
    xs = xs.reshape(b, t, h, self.head_dim)                     # [B, T, H, P]
    k = self._bc(B.reshape(b, t, g, n), self.B_norm, self.B_bias)
    q = self._bc(C.reshape(b, t, g, n), self.C_norm, self.C_bias)
    dt = jax.nn.softplus(dd_dt.astype(jnp.float32)
                         + self.dt_bias[...].astype(jnp.float32))  # [B, T, H]
    a = jnp.minimum(-jax.nn.softplus(dd_a.astype(jnp.float32)),
                    -self.A_floor)                              # [B, T, H]
    angles = jnp.broadcast_to(angles.astype(jnp.float32)[:, :, None],
                              (b, t, h, self.n_angles))         # [B, T, H, A]
    y, state = self.apply_forms(
        ctx, MAMBA3_FORMS,
        dict(q=q, k=k, v=xs, g=a * dt, dt=dt,
             trap=trap.astype(jnp.float32), angles=angles),
        ctx.cache)                                              # [B, T, H, P]
    y = y.astype(jnp.float32) + (self.D[...].astype(jnp.float32)[:, None]
                                 * xs.astype(jnp.float32))
    if self.norm is None:
      y = (y.reshape(b, t, e)
           * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)
    else:
      y = self.norm(y.astype(x.dtype), z)
    return self.out_proj(y), state
