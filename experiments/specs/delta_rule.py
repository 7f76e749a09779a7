"""Specs of the delta-rule core's variants and of RWKV-6.

Delta-rule ops get raw keys and normalise q and k inside the op
(``use_qk_l2norm=True``, as Gated DeltaNet and KDA models do); beta is in
(0, 1) with gentle gates and in (0, 2) (negative eigenvalues) with strong
ones. RWKV-7 gets ``a = -kappa`` and ``b = kappa * eta`` for a unit
"removal key" kappa, as the model builds them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiments.specs.base import OpSpec
from experiments.specs.gated_linear import _forms, _log_gate, _qkv
from lin_attn_jax import ops


def _delta_inputs(key, dims, strong, gate=None):
  key, kg, kb = jax.random.split(key, 3)
  inputs = _qkv(key, dims)
  b, t, h = dims.batch, dims.length, dims.heads
  beta = jax.nn.sigmoid(jax.random.normal(kb, (b, t, h), jnp.float32))
  inputs["beta"] = 2.0 * beta if strong else beta
  if gate == "scalar":
    inputs["g"] = _log_gate(kg, (b, t, h), strong)
  elif gate == "channel":
    inputs["g"] = _log_gate(kg, (b, t, h, dims.dim_k), strong)
  return inputs


def _rwkv6_inputs(key, dims, strong):
  key, kw, ku = jax.random.split(key, 3)
  inputs = _qkv(key, dims)
  inputs["r"] = inputs.pop("q")
  inputs["w"] = _log_gate(
      kw, (dims.batch, dims.length, dims.heads, dims.dim_k), strong)
  inputs["u"] = jax.random.normal(ku, (dims.heads, dims.dim_k), jnp.float32)
  return inputs


def _rwkv7_inputs(key, dims, strong):
  key, kw, kappa_key, rate_key = jax.random.split(key, 4)
  inputs = _qkv(key, dims)
  shape = (dims.batch, dims.length, dims.heads, dims.dim_k)
  inputs["r"] = inputs.pop("q")
  inputs["w"] = _log_gate(kw, shape, strong)
  kappa = jax.random.normal(kappa_key, shape, jnp.float32)
  kappa = kappa / jnp.linalg.norm(kappa, axis=-1, keepdims=True)
  rate = jax.nn.sigmoid(jax.random.normal(rate_key, shape, jnp.float32))
  inputs["a"] = -kappa
  inputs["b"] = kappa * rate
  return inputs


_DELTA_GRADS = ("q", "k", "v", "beta", "initial_state")

SPECS = [
    OpSpec("delta_rule",
           _forms("delta_rule", ops.delta_rule_step, ("q", "k", "v", "beta"),
                  use_qk_l2norm=True),
           _delta_inputs, _DELTA_GRADS),
    OpSpec("gated_delta_rule",
           _forms("gated_delta_rule", ops.gated_delta_rule_step,
                  ("q", "k", "v", "g", "beta"), use_qk_l2norm=True),
           functools.partial(_delta_inputs, gate="scalar"),
           _DELTA_GRADS + ("g",)),
    OpSpec("kda",
           _forms("kda", ops.kda_step, ("q", "k", "v", "g", "beta"),
                  use_qk_l2norm=True),
           functools.partial(_delta_inputs, gate="channel"),
           _DELTA_GRADS + ("g",)),
    OpSpec("rwkv6", _forms("rwkv6", ops.rwkv6_step, ("r", "k", "v", "w")),
           _rwkv6_inputs,
           ("r", "k", "v", "w", "u", "initial_state")),
    OpSpec("rwkv7",
           _forms("rwkv7", ops.rwkv7_step, ("r", "w", "k", "v", "a", "b")),
           _rwkv7_inputs, ("r", "w", "k", "v", "a", "b", "initial_state"),
           tol=1e-4, grad_tol=1e-4),
]
