"""Specs of the gated-linear-attention core's variants."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiments.specs.base import OpSpec, scan_steps
from lin_attn_jax import feature_maps
from lin_attn_jax import ops
from lin_attn_jax.ops.retention import retention_log_decay


def _segments(key, batch, length):
  starts = jax.random.bernoulli(key, 0.05, (batch, length)).astype(jnp.int32)
  return jnp.cumsum(starts, axis=1)


def _log_gate(key, shape, strong):
  g = jax.nn.log_sigmoid(jax.random.normal(key, shape, jnp.float32))
  return g / 0.05 if strong else g


def _qkv(key, dims, dim_k=None, state_k=None, state_v=None):
  dim_k = dims.dim_k if dim_k is None else dim_k
  kq, kk, kv, ks, kseg = jax.random.split(key, 5)
  b, t, h, dv = dims.batch, dims.length, dims.heads, dims.dim_v
  return dict(
      q=jax.random.normal(kq, (b, t, h, dim_k), jnp.float32),
      k=jax.random.normal(kk, (b, t, h, dim_k), jnp.float32),
      v=jax.random.normal(kv, (b, t, h, dv), jnp.float32),
      initial_state=jax.random.normal(
          ks, (b, h, state_k or dim_k, state_v or dv), jnp.float32),
      segment_ids=_segments(kseg, b, t),
  )


def _step_form(step, names, **static):
  def form(*, initial_state=None, segment_ids=None, output_final_state=False,
           **inputs):
    seq = {n: inputs.pop(n) for n in names}
    return scan_steps(step, seq, initial_state=initial_state,
                      segment_ids=segment_ids,
                      output_final_state=output_final_state, **inputs, **static)
  return form


def _forms(prefix, step, step_names, **static):
  forms = {name: functools.partial(getattr(ops, f"{name}_{prefix}"), **static)
           for name in ("naive_recurrent", "parallel", "chunk", "recurrent")}
  forms = {("naive" if n == "naive_recurrent" else n): f
           for n, f in forms.items()}
  forms["step"] = _step_form(step, step_names, **static)
  return forms


def _linear_inputs(key, dims, strong, normalize=False):
  del strong
  inputs = _qkv(key, dims, state_v=dims.dim_v + 1 if normalize else None)
  if normalize:
    inputs["q"] = feature_maps.elu_plus_one(inputs["q"])
    inputs["k"] = feature_maps.elu_plus_one(inputs["k"])
  return inputs


def _simple_gla_inputs(key, dims, strong):
  key, kg = jax.random.split(key)
  inputs = _qkv(key, dims)
  inputs["g"] = _log_gate(kg, (dims.batch, dims.length, dims.heads), strong)
  return inputs


def _gla_inputs(key, dims, strong):
  key, kg = jax.random.split(key)
  inputs = _qkv(key, dims)
  inputs["g"] = _log_gate(
      kg, (dims.batch, dims.length, dims.heads, dims.dim_k), strong)
  return inputs


def _retention_inputs(key, dims, strong):
  del strong
  return _qkv(key, dims)


BASED_FEATURE_DIM = 8


def _based_inputs(key, dims, strong):
  del strong
  dk = BASED_FEATURE_DIM
  inputs = _qkv(key, dims, dim_k=dk, state_k=1 + dk + dk * dk,
                state_v=dims.dim_v + 1)
  inputs["q"] = 0.5 * inputs["q"]
  inputs["k"] = 0.5 * inputs["k"]
  return inputs


SPECS = [
    OpSpec("linear_attn", _forms("linear_attn", ops.linear_attn_step,
                                 ("q", "k", "v")),
           _linear_inputs, ("q", "k", "v", "initial_state")),
    OpSpec("linear_attn_normalized",
           _forms("linear_attn", ops.linear_attn_step, ("q", "k", "v"),
                  normalize=True),
           functools.partial(_linear_inputs, normalize=True),
           ("q", "k", "v", "initial_state")),
    OpSpec("simple_gla", _forms("simple_gla", ops.simple_gla_step,
                                ("q", "k", "v", "g")),
           _simple_gla_inputs, ("q", "k", "v", "g", "initial_state")),
    OpSpec("retention", _forms("retention", ops.retention_step,
                               ("q", "k", "v")),
           _retention_inputs, ("q", "k", "v", "initial_state")),
    OpSpec("gla", _forms("gla", ops.gla_step, ("q", "k", "v", "g")),
           _gla_inputs, ("q", "k", "v", "g", "initial_state")),
    OpSpec("based", _forms("based", ops.based_step, ("q", "k", "v")),
           _based_inputs, ("q", "k", "v", "initial_state")),
]

__all__ = ["SPECS", "retention_log_decay"]
