"""Specs of the diagonal-SSM core and the ops on it.

Every recurrent form here is already the ``lax.scan`` of the op's step, so
the step is verified through it (``OpSpec.step`` names the step and the
inputs it takes one token of, for the tests that call every step). ``Dims.heads`` is the number of groups of
``B``/``C`` for the selective scan (1: the ungrouped ``[B, T, N]`` layout)
and the number of heads for SSD (with ``heads // 2`` groups when even).
H3's S4D has its chunk form (Toeplitz matmuls inside chunks) checked with
segment ids like every other op.

"Strong" inputs have per-token log-decays spread down to -30.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiments.specs.base import OpSpec, StepForm
from lin_attn_jax import ops

_F32 = jnp.float32
STRONGEST_LOG_DECAY = -30.0


def _segments(key, batch, length):
  starts = jax.random.bernoulli(key, 0.05, (batch, length)).astype(jnp.int32)
  return jnp.cumsum(starts, axis=1)


def _normal(key, shape, scale=1.0, shift=0.0):
  return shift + scale * jax.random.normal(key, shape, _F32)


def _log_decay(key, shape, strong):
  """Gentle: ``log_sigmoid(N(2, 1))`` (about -0.1); strong: U(-30, 0)."""
  if strong:
    return jax.random.uniform(key, shape, _F32, STRONGEST_LOG_DECAY, 0.0)
  return jax.nn.log_sigmoid(_normal(key, shape, shift=2.0))


def _forms(op, names=("naive_recurrent", "parallel", "chunk", "recurrent"),
           **static):
  forms = {}
  for name in names:
    fn = getattr(ops, f"{name}_{op}")
    forms["naive" if name == "naive_recurrent" else name] = (
        functools.partial(fn, **static) if static else fn)
  return forms


def _step(op, tokens, **static):
  """``op``'s step, taking one token of the inputs ``tokens``."""
  return StepForm(getattr(ops, f"{op}_step"), tokens, static)


def _linear_scan_inputs(key, dims, strong):
  ka, kb, ks, kseg = jax.random.split(key, 4)
  b, t, d = dims.batch, dims.length, dims.dim_v
  return dict(a=jnp.exp(_log_decay(ka, (b, t, d), strong)),
              b=_normal(kb, (b, t, d)), initial_state=_normal(ks, (b, d)),
              segment_ids=_segments(kseg, b, t))


def _selective_scan_inputs(key, dims, strong):
  keys = jax.random.split(key, 10)
  b, t, d, n, g = dims.batch, dims.length, dims.dim_v, dims.dim_k, dims.heads
  proj = (b, t, n) if g == 1 else (b, t, g, n)
  # dt = softplus(delta + delta_bias) in about (0.05, 2.5); strong A reaches
  # dt * A = -30.
  a = (-jax.random.uniform(keys[2], (d, n), _F32, 1.0, 12.0) if strong
       else -jnp.exp(_normal(keys[2], (d, n), 0.5)))
  return dict(u=_normal(keys[0], (b, t, d)),
              delta=_normal(keys[1], (b, t, d), shift=-1.0), A=a,
              B=_normal(keys[3], proj), C=_normal(keys[4], proj),
              D=_normal(keys[5], (d,)), z=_normal(keys[6], (b, t, d)),
              delta_bias=_normal(keys[7], (d,), 0.5),
              initial_state=_normal(keys[8], (b, d, n)),
              segment_ids=_segments(keys[9], b, t))


def ssd_groups(heads):
  return heads // 2 if heads > 1 and heads % 2 == 0 else 1


def _ssd_inputs(key, dims, strong):
  keys = jax.random.split(key, 9)
  b, t, h, n, p = dims.batch, dims.length, dims.heads, dims.dim_k, dims.dim_v
  g = ssd_groups(h)
  a = (-jax.random.uniform(keys[2], (h,), _F32, 1.0, 12.0) if strong
       else -jnp.exp(_normal(keys[2], (h,), 0.5)))
  return dict(x=_normal(keys[0], (b, t, h, p)),
              dt=_normal(keys[1], (b, t, h), shift=-1.0), A=a,
              B=_normal(keys[3], (b, t, g, n)),
              C=_normal(keys[4], (b, t, g, n)),
              D=_normal(keys[5], (h,)), dt_bias=_normal(keys[6], (h,), 0.5),
              initial_state=_normal(keys[7], (b, h, n, p)),
              segment_ids=_segments(keys[8], b, t))


CONV_WIDTH = 4


def _conv_inputs(key, dims, strong):
  del strong
  kx, kw, kb, ks, kseg = jax.random.split(key, 5)
  b, t, d = dims.batch, dims.length, dims.dim_v
  return dict(x=_normal(kx, (b, t, d)),
              weight=_normal(kw, (d, CONV_WIDTH), 0.5),
              bias=_normal(kb, (d,)),
              initial_state=_normal(ks, (b, CONV_WIDTH - 1, d)),
              segment_ids=_segments(kseg, b, t))


def _shift_ssm_inputs(key, dims, strong):
  del strong
  ku, kc, kd, ks, kseg = jax.random.split(key, 5)
  b, t, d, n = dims.batch, dims.length, dims.dim_v, dims.dim_k
  return dict(u=_normal(ku, (b, t, d)), C=_normal(kc, (d, n), n ** -0.5),
              D=_normal(kd, (d,)), initial_state=_normal(ks, (b, n - 1, d)),
              segment_ids=_segments(kseg, b, t))


def _s4d_inputs(key, dims, strong):
  keys = jax.random.split(key, 9)
  b, t, d, n = dims.batch, dims.length, dims.dim_v, dims.dim_k
  if strong:   # dt * A_real between -30 and -0.5
    log_dt = jax.random.uniform(keys[1], (d,), _F32, jnp.log(0.5), jnp.log(2.0))
    a_real = -jax.random.uniform(keys[2], (d, n), _F32, 1.0, 15.0)
  else:        # S4D-Lin: dt in [1e-3, 1e-1], A = -1/2 + i pi n
    log_dt = jax.random.uniform(keys[1], (d,), _F32, jnp.log(1e-3),
                                jnp.log(1e-1))
    a_real = -0.5 * jnp.exp(_normal(keys[2], (d, n), 0.2))
  a_imag = jnp.pi * jnp.arange(n, dtype=_F32) * jnp.ones((d, 1), _F32)
  return dict(u=_normal(keys[0], (b, t, d)), log_dt=log_dt, A_real=a_real,
              A_imag=a_imag + _normal(keys[3], (d, n), 0.1),
              B=_normal(keys[4], (d, n, 2)), C=_normal(keys[5], (d, n, 2)),
              D=_normal(keys[6], (d,)),
              initial_state=_normal(keys[7], (b, d, n, 2)),
              segment_ids=_segments(keys[8], b, t))


def _rg_lru_inputs(key, dims, strong):
  keys = jax.random.split(key, 6)
  b, t, d = dims.batch, dims.length, dims.dim_v
  # softplus(a_param) = -log(a); strong: c * r * softplus(a_param) up to 30.
  low, high = (0.5, 3.75) if strong else (1e-3, 0.1)
  softplus = jax.random.uniform(keys[3], (d,), _F32, low, high)
  return dict(x=_normal(keys[0], (b, t, d)), a_gate=_normal(keys[1], (b, t, d)),
              x_gate=_normal(keys[2], (b, t, d)),
              a_param=jnp.log(jnp.expm1(softplus)),
              initial_state=_normal(keys[4], (b, d)),
              segment_ids=_segments(keys[5], b, t))


def _hgrn_inputs(key, dims, strong):
  kx, kg, ks, kseg = jax.random.split(key, 4)
  b, t, d = dims.batch, dims.length, dims.dim_v
  g = _log_decay(kg, (b, t, d), strong)
  return dict(x=(-jnp.expm1(g)) * _normal(kx, (b, t, d)), g=g,
              initial_state=_normal(ks, (b, d)),
              segment_ids=_segments(kseg, b, t))


SPECS = [
    OpSpec("linear_scan", _forms("linear_scan"), _linear_scan_inputs,
           ("a", "b", "initial_state"), step=_step("linear_scan", ("a", "b"))),
    OpSpec("selective_scan", _forms("selective_scan", delta_softplus=True),
           _selective_scan_inputs,
           ("u", "delta", "A", "B", "C", "D", "z", "delta_bias",
            "initial_state"),
           step=_step("selective_scan", ("u", "delta", "B", "C", "z"),
                      delta_softplus=True)),
    OpSpec("ssd", _forms("ssd", dt_softplus=True), _ssd_inputs,
           ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_state"),
           step=_step("ssd", ("x", "dt", "B", "C"), dt_softplus=True)),
    OpSpec("causal_conv1d", _forms("causal_conv1d", activation="silu"),
           _conv_inputs, ("x", "weight", "bias", "initial_state"),
           step=_step("causal_conv1d", ("x",), activation="silu")),
    OpSpec("shift_ssm", _forms("shift_ssm"), _shift_ssm_inputs,
           ("u", "C", "D", "initial_state"), step=_step("shift_ssm", ("u",))),
    OpSpec("s4d", _forms("s4d"), _s4d_inputs,
           ("u", "log_dt", "A_real", "A_imag", "B", "C", "D", "initial_state"),
           step=_step("s4d", ("u",))),
    OpSpec("rg_lru", _forms("rg_lru"), _rg_lru_inputs,
           ("x", "a_gate", "x_gate", "a_param", "initial_state"),
           step=_step("rg_lru", ("x", "a_gate", "x_gate"))),
    OpSpec("hgrn", _forms("hgrn"), _hgrn_inputs, ("x", "g", "initial_state"),
           step=_step("hgrn", ("x", "g"))),
]
