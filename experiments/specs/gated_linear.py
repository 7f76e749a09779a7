"""Specs of the gated-linear-attention core's variants."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiments.specs.base import OpSpec, StepForm
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


def _forms(prefix, step, step_names, **static):
  forms = {name: functools.partial(getattr(ops, f"{name}_{prefix}"), **static)
           for name in ("naive_recurrent", "parallel", "chunk", "recurrent")}
  forms = {("naive" if n == "naive_recurrent" else n): f
           for n, f in forms.items()}
  forms["step"] = StepForm(step, tuple(step_names), static)
  return forms


def _normalized_state(key, dims, feature_map, dim_k, prior=16):
  """A state a normalized op can have reached: ``sum_j phi(k_j) [v_j, 1]``
  over ``prior`` random earlier tokens (a random normalizer column could put
  a denominator ``q . z`` near 0, where no float32 form is accurate)."""
  kk, kv = jax.random.split(key)
  b, h = dims.batch, dims.heads
  k = feature_map(jax.random.normal(kk, (b, prior, h, dim_k), jnp.float32))
  v = jax.random.normal(kv, (b, prior, h, dims.dim_v), jnp.float32)
  v = jnp.concatenate([v, jnp.ones_like(v[..., :1])], axis=-1)
  return jnp.einsum("bjhk,bjhv->bhkv", k, v)


def _linear_inputs(key, dims, strong, normalize=False):
  del strong
  key, ks = jax.random.split(key)
  inputs = _qkv(key, dims, state_v=dims.dim_v + 1 if normalize else None)
  if normalize:
    inputs["q"] = feature_maps.elu_plus_one(inputs["q"])
    inputs["k"] = feature_maps.elu_plus_one(inputs["k"])
    inputs["initial_state"] = _normalized_state(
        ks, dims, feature_maps.elu_plus_one, dims.dim_k)
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
  key, ks = jax.random.split(key)
  inputs = _qkv(key, dims, dim_k=dk, state_k=1 + dk + dk * dk,
                state_v=dims.dim_v + 1)
  inputs["q"] = 0.5 * inputs["q"]
  inputs["k"] = 0.5 * inputs["k"]
  inputs["initial_state"] = _normalized_state(
      ks, dims, lambda x: feature_maps.taylor(0.5 * x), dk)
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
