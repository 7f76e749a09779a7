"""Context parallelism: ops split over a ``sequence`` mesh axis of 8 CPU
devices against the single-device chunk forms.

For every op: outputs, final states and the gradients of every float input
(random cotangents, the initial state and the parameters included) under
meshes ``data x sequence`` with ``P`` in {2, 4, 8} and ``T = 32``, so that
each device holds 16, 8 or 4 tokens of 4-token chunks, against the
single-device chunk form, relative RMS error <= 1e-5 (float32). Documents
start inside devices and exactly at device boundaries (row 0 at 5, 8, 16,
19; row 1 at 7, 8, 12, 24: a one-token document before a boundary, and ids
reused by later documents). One op of each kind of split runs at every P,
the others (which reach the same split through their core) at one P each;
a run without initial state and segment ids covers each kind. One compiled
reference per op serves all its runs. Compile time, not run time, is what
these tests cost, so each op compiles once per P.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from lin_attn_jax import ops
from lin_attn_jax.ops.common import context_parallel
from lin_attn_jax.ops.conv import token_shift
from lin_attn_jax.testing import rel_rms

B, T, H, K, V = 2, 32, 2, 8, 4
CHUNK = 4
TOL = 1e-5
# Compile time is what these tests cost; the backend's optimisations do not
# change the arithmetic checked here and take a third of it.
FAST = {"xla_backend_optimization_level": 0}


def jit(fn):
  return jax.jit(fn, compiler_options=FAST)
IDS = np.array([[0] * 5 + [1] * 3 + [0] * 8 + [2] * 3 + [1] * 13,
                [0] * 7 + [1] * 1 + [2] * 4 + [0] * 12 + [3] * 8], np.int32)


def mesh(parts: int):
  return jax.make_mesh((8 // parts, parts), ("data", "sequence"),
                       axis_types=(AxisType.Auto,) * 2)


def _normal(seed, shape, scale=1.0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape)
                     * scale, jnp.float32)


def _log_gate(seed, shape):
  return jax.nn.log_sigmoid(_normal(seed, shape) + 2.0)


def _unit(seed, shape):
  x = _normal(seed, shape)
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


# Each case: (inputs, state shape or None, fn(**inputs, initial_state,
# segment_ids) -> (o, final state or None)). Every float input is
# differentiated.


def _gated_linear(form, gate, **kw):
  def make():
    inputs = dict(q=_normal(0, (B, T, H, K)), k=_normal(1, (B, T, H, K)),
                  v=_normal(2, (B, T, H, V)))
    if gate == "channel":
      inputs["g"] = _log_gate(3, (B, T, H, K))
    elif gate == "scalar":
      inputs["g"] = _log_gate(3, (B, T, H))
    return inputs, (B, H, K, V)

  def fn(initial_state, segment_ids, **inputs):
    return form(**inputs, initial_state=initial_state,
                output_final_state=True, segment_ids=segment_ids,
                chunk_size=CHUNK, **kw)
  return make, fn


def _linear_attn():
  def make():
    q, k = (jax.nn.elu(_normal(i, (B, T, H, K))) + 1 for i in (0, 1))
    return dict(q=q, k=k, v=_normal(2, (B, T, H, V))), (B, H, K, V + 1)

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_linear_attn(**inputs, normalize=True,
                                 initial_state=initial_state,
                                 output_final_state=True,
                                 segment_ids=segment_ids, chunk_size=CHUNK)
  return make, fn


def _based():
  dk = 4
  def make():
    return (dict(q=_normal(0, (B, T, H, dk)), k=_normal(1, (B, T, H, dk)),
                 v=_normal(2, (B, T, H, V))), (B, H, 1 + dk + dk * dk, V + 1))

  def fn(initial_state, segment_ids, **inputs):
    o, s = ops.chunk_based(**inputs, initial_state=initial_state,
                           output_final_state=True, segment_ids=segment_ids,
                           chunk_size=CHUNK)
    return o, s
  return make, fn


def _ssd():
  heads, groups, n, p = 4, 2, 4, 4
  def make():
    return (dict(x=_normal(0, (B, T, heads, p)), dt=_normal(1, (B, T, heads)),
                 A=-jnp.exp(_normal(2, (heads,))),
                 B=_normal(3, (B, T, groups, n)),
                 C=_normal(4, (B, T, groups, n)), D=_normal(5, (heads,)),
                 dt_bias=_normal(6, (heads,))), (B, heads, n, p))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_ssd(**inputs, dt_softplus=True,
                         initial_state=initial_state, output_final_state=True,
                         segment_ids=segment_ids, chunk_size=CHUNK)
  return make, fn


def _rwkv6():
  def make():
    return (dict(r=_normal(0, (B, T, H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, H, V)), w=_log_gate(3, (B, T, H, K)),
                 u=_normal(4, (H, K))), (B, H, K, V))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_rwkv6(**inputs, scale=1.0, initial_state=initial_state,
                           output_final_state=True, segment_ids=segment_ids,
                           chunk_size=CHUNK)
  return make, fn


def _delta(form, gate):
  hv = 2 * H
  def make():
    inputs = dict(q=_normal(0, (B, T, H, K)), k=_normal(1, (B, T, H, K)),
                  v=_normal(2, (B, T, hv, V)),
                  beta=jax.nn.sigmoid(_normal(4, (B, T, hv))))
    if gate == "scalar":
      inputs["g"] = _log_gate(3, (B, T, hv))
    elif gate == "channel":
      inputs["g"] = _log_gate(3, (B, T, hv, K))
    return inputs, (B, hv, K, V)

  def fn(initial_state, segment_ids, **inputs):
    return form(**inputs, initial_state=initial_state,
                output_final_state=True, segment_ids=segment_ids,
                chunk_size=CHUNK, sub_chunk_size=2, use_qk_l2norm=True)
  return make, fn


def _gated_delta_product():
  """2 Householder steps per token, 2 value heads per key head."""
  hv, n = 2 * H, 2
  def make():
    return (dict(q=_normal(0, (B, T, H, K)), k=_normal(1, (B, T, n, H, K)),
                 v=_normal(2, (B, T, n, hv, V)), g=_log_gate(3, (B, T, hv)),
                 beta=2 * jax.nn.sigmoid(_normal(4, (B, T, n, hv)))),
            (B, hv, K, V))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_gated_delta_product(
        **inputs, initial_state=initial_state, output_final_state=True,
        segment_ids=segment_ids, chunk_size=CHUNK, sub_chunk_size=2,
        use_qk_l2norm=True)
  return make, fn


def _rwkv7():
  def make():
    kappa = _unit(5, (B, T, H, K))
    eta = jax.nn.sigmoid(_normal(6, (B, T, H, K)))
    return (dict(r=_normal(0, (B, T, H, K)), w=_log_gate(3, (B, T, H, K)),
                 k=_normal(1, (B, T, H, K)), v=_normal(2, (B, T, H, V)),
                 a=-kappa, b=kappa * eta), (B, H, K, V))

  def fn(initial_state, segment_ids, **inputs):
    # With the RWKV-7 layer's decay bound: the split passes it through.
    return ops.chunk_rwkv7(**inputs, scale=1.0, initial_state=initial_state,
                           output_final_state=True, segment_ids=segment_ids,
                           chunk_size=CHUNK, sub_chunk_size=2,
                           min_log_decay=-math.exp(-0.5))
  return make, fn


def _gdn2():
  hv = 2 * H
  def make():
    return (dict(q=_normal(0, (B, T, H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, hv, V)), g=_log_gate(3, (B, T, hv, K)),
                 b=2.0 * jax.nn.sigmoid(_normal(4, (B, T, hv, K))),
                 w=jax.nn.sigmoid(_normal(5, (B, T, hv, V)))), (B, hv, K, V))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_gdn2(**inputs, initial_state=initial_state,
                          output_final_state=True, segment_ids=segment_ids,
                          chunk_size=CHUNK, sub_chunk_size=2,
                          use_qk_l2norm=True)
  return make, fn


def _comba():
  hv = 2 * H
  def make():
    k = _normal(1, (B, T, H, K))
    return (dict(q=_normal(0, (B, T, H, K)), k=k,
                 v=_normal(2, (B, T, hv, V)),
                 p=0.8 * k + 0.6 * _normal(4, (B, T, H, K)),
                 g=_log_gate(3, (B, T, hv)),
                 beta=jax.nn.sigmoid(_normal(5, (B, T, hv)))), (B, hv, K, V))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_comba(**inputs, initial_state=initial_state,
                           output_final_state=True, segment_ids=segment_ids,
                           chunk_size=CHUNK, sub_chunk_size=2,
                           use_qk_l2norm=True)
  return make, fn


def _log_linear():
  levels = 5
  def make():
    return (dict(q=_normal(0, (B, T, H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, H, V)), g=_log_gate(3, (B, T, H)),
                 level_scales=2.0 * jax.nn.sigmoid(
                     _normal(4, (B, T, H, levels)))), (B, H, levels, K, V))

  def fn(initial_state, segment_ids, **inputs):
    # Positions from 3: blocks of 2^l positions straddle the devices.
    return ops.chunk_log_linear_attn(
        **inputs, initial_state=initial_state, output_final_state=True,
        segment_ids=segment_ids, offset=3, chunk_size=CHUNK,
        sub_chunk_size=2)
  return make, fn


def _diagonal(name):
  d = 6
  def make():
    if name == "linear_scan":
      inputs = dict(a=jax.nn.sigmoid(_normal(0, (B, T, d)) + 2),
                    b=_normal(1, (B, T, d)))
    elif name == "rg_lru":
      inputs = dict(x=_normal(0, (B, T, d)), a_gate=_normal(1, (B, T, d)),
                    x_gate=_normal(2, (B, T, d)), a_param=_normal(3, (d,)))
    else:
      inputs = dict(x=_normal(0, (B, T, d)), g=_log_gate(1, (B, T, d)))
    return inputs, (B, d)

  form = {"linear_scan": ops.chunk_linear_scan, "rg_lru": ops.chunk_rg_lru,
          "hgrn": ops.chunk_hgrn}[name]

  def fn(initial_state, segment_ids, **inputs):
    return form(**inputs, initial_state=initial_state,
                output_final_state=True, segment_ids=segment_ids,
                chunk_size=CHUNK)
  return make, fn


def _selective_scan():
  d, n = 6, 3
  def make():
    return (dict(u=_normal(0, (B, T, d)), delta=_normal(1, (B, T, d)),
                 A=-jnp.exp(_normal(2, (d, n))), B=_normal(3, (B, T, n)),
                 C=_normal(4, (B, T, n)), D=_normal(5, (d,)),
                 z=_normal(6, (B, T, d)), delta_bias=_normal(7, (d,))),
            (B, d, n))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_selective_scan(**inputs, delta_softplus=True,
                                    initial_state=initial_state,
                                    output_final_state=True,
                                    segment_ids=segment_ids, chunk_size=CHUNK)
  return make, fn


def _conv():
  d, w = 6, 4
  def make():
    return (dict(x=_normal(0, (B, T, d)), weight=_normal(1, (d, w)),
                 bias=_normal(2, (d,))), (B, w - 1, d))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_causal_conv1d(**inputs, activation="silu",
                                   initial_state=initial_state,
                                   output_final_state=True,
                                   segment_ids=segment_ids, chunk_size=CHUNK)
  return make, fn


def _token_shift():
  d = 6
  def make():
    return dict(x=_normal(0, (B, T, d))), (B, d)

  def fn(initial_state, segment_ids, x):
    return token_shift(x, initial_state, segment_ids), None
  return make, fn


def _softmax(**kw):
  def make():
    return (dict(q=_normal(0, (B, T, 2 * H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, H, V))), None)

  def fn(initial_state, segment_ids, **inputs):
    del initial_state
    return ops.chunk_softmax_attn(**inputs, segment_ids=segment_ids,
                                  block_size=CHUNK, **kw), None
  return make, fn


def _stickbreaking():
  def make():
    return (dict(q=_normal(0, (B, T, 2 * H, K), 3.0),
                 k=_normal(1, (B, T, H, K)), v=_normal(2, (B, T, H, V))),
            None)

  def fn(initial_state, segment_ids, **inputs):
    del initial_state
    # The remaining stick takes the final state's place: it is checked too.
    return ops.chunk_stickbreaking_attn(**inputs, segment_ids=segment_ids,
                                        block_size=CHUNK, output_rem=True)
  return make, fn


def _forgetting(**kw):
  def make():
    return (dict(q=_normal(0, (B, T, 2 * H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, H, V)), g=_log_gate(3, (B, T, 2 * H))),
            None)

  def fn(initial_state, segment_ids, **inputs):
    del initial_state
    return ops.chunk_forgetting_attn(**inputs, segment_ids=segment_ids,
                                     block_size=CHUNK, **kw), None
  return make, fn


def _nsa():
  def make():
    gates = {name: jax.nn.sigmoid(_normal(3 + i, (B, T, 2 * H)))
             for i, name in enumerate(("g_cmp", "g_slc", "g_swa"))}
    return (dict(q=_normal(0, (B, T, 2 * H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, H, V)), **gates), None)

  def fn(initial_state, segment_ids, **inputs):
    del initial_state
    return ops.chunk_nsa(**inputs, segment_ids=segment_ids, block_size=3,
                         block_counts=4, window_size=6,
                         chunk_size=CHUNK), None
  return make, fn


def _moba():
  def make():
    return (dict(q=_normal(0, (B, T, 2 * H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, H, V))), None)

  def fn(initial_state, segment_ids, **inputs):
    del initial_state
    return ops.chunk_moba(**inputs, segment_ids=segment_ids, block_size=3,
                          top_k=2, chunk_size=CHUNK), None
  return make, fn


def _path(gate=True):
  def make():
    inputs = dict(q=_normal(0, (B, T, 2 * H, K)), k=_normal(1, (B, T, H, K)),
                  v=_normal(2, (B, T, H, V)), w=_unit(5, (B, T, H, K)),
                  beta=2.0 * jax.nn.sigmoid(_normal(6, (B, T, H))))
    if gate:
      inputs["g"] = _log_gate(3, (B, T, 2 * H))
    return inputs, None

  def fn(initial_state, segment_ids, **inputs):
    del initial_state
    return ops.chunk_path_attn(**inputs, segment_ids=segment_ids,
                               chunk_size=CHUNK), None
  return make, fn


def _mlstm():
  def make():
    return (dict(q=_normal(0, (B, T, H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, H, V)), i=_normal(3, (B, T, H), 4.0),
                 f=_normal(4, (B, T, H)) + 2.0), (B, H, K, V + 2))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_mlstm(**inputs, initial_state=initial_state,
                           output_final_state=True, segment_ids=segment_ids,
                           chunk_size=CHUNK)
  return make, fn


def _mamba3():
  def make():
    return (dict(q=_normal(0, (B, T, H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, H, V)), g=_log_gate(3, (B, T, H)),
                 dt=jax.nn.softplus(_normal(4, (B, T, H))),
                 trap=_normal(5, (B, T, H)), angles=_normal(6, (B, T, H, 2))),
            (B, H, K + 1, V + 1))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_mamba3(**inputs, initial_state=initial_state,
                            output_final_state=True, segment_ids=segment_ids,
                            chunk_size=CHUNK)
  return make, fn


def _mamba3_mimo(rank=2):
  def make():
    return (dict(q=_normal(0, (B, T, H, rank, K)),
                 k=_normal(1, (B, T, H, rank, K)),
                 v=_normal(2, (B, T, H, rank, V)), g=_log_gate(3, (B, T, H)),
                 dt=jax.nn.softplus(_normal(4, (B, T, H))),
                 trap=_normal(5, (B, T, H)), angles=_normal(6, (B, T, H, 2))),
            (B, H, K + rank, V + rank))

  def fn(initial_state, segment_ids, **inputs):
    return ops.chunk_mamba3_mimo(**inputs, initial_state=initial_state,
                                 output_final_state=True,
                                 segment_ids=segment_ids, chunk_size=CHUNK)
  return make, fn


def _mesa_net():
  def make():
    keys = _normal(5, (B, 16, H, K))
    keys = keys / jnp.linalg.norm(keys, axis=-1, keepdims=True)
    return (dict(q=_normal(0, (B, T, H, K)), k=_normal(1, (B, T, H, K)),
                 v=_normal(2, (B, T, H, V)), g=_log_gate(3, (B, T, H)),
                 beta=jax.nn.sigmoid(_normal(4, (B, T, H))),
                 lamb=jax.nn.softplus(_normal(6, (H, K))) + 0.25,
                 keys=keys), (B, H, K, V))

  def fn(initial_state, segment_ids, keys, **inputs):
    # A reachable initial H^kk (symmetric, positive semi-definite) beside
    # the random H^kv of the case.
    if initial_state is not None:
      initial_state = ops.pack_mesa_net_state(
          jnp.einsum("bjhk,bjhl->bhkl", keys, keys), initial_state)
    return ops.chunk_mesa_net(**inputs, initial_state=initial_state,
                              output_final_state=True,
                              segment_ids=segment_ids, chunk_size=CHUNK,
                              use_qk_l2norm=True)
  return make, fn


# name: (case, the P values it runs at with segment ids and initial state).
# One core form of each kind runs at every P; the other ops reach the same
# split code through their core and run at one P each.
CASES = {
    "gla": (_gated_linear(ops.chunk_gla, "channel"), (2, 4, 8)),
    "simple_gla": (_gated_linear(ops.chunk_simple_gla, "scalar"), (8,)),
    "rwkv6": (_rwkv6(), (4,)),
    "linear_attn": (_linear_attn(), (2,)),
    "retention": (_gated_linear(ops.chunk_retention, None), (4,)),
    "based": (_based(), (8,)),
    "ssd": (_ssd(), (2,)),
    "gated_delta_rule": (_delta(ops.chunk_gated_delta_rule, "scalar"),
                         (2, 4, 8)),
    "kda": (_delta(ops.chunk_kda, "channel"), (8,)),
    "delta_rule": (_delta(ops.chunk_delta_rule, None), (4,)),
    "rwkv7": (_rwkv7(), (2,)),
    "linear_scan": (_diagonal("linear_scan"), (2, 4, 8)),
    "rg_lru": (_diagonal("rg_lru"), (4,)),
    "hgrn": (_diagonal("hgrn"), (8,)),
    "selective_scan": (_selective_scan(), (2,)),
    "causal_conv1d": (_conv(), (2, 4, 8)),
    "token_shift": (_token_shift(), (2, 4, 8)),
    "softmax_attn": (_softmax(), (2, 4, 8)),
    # w - 1 = 5 tokens: a halo for 16 and 8 tokens per device, the gathered
    # path for 4.
    "sliding_window_attn": (_softmax(window_size=6), (2, 4, 8)),
    # Blocks of 3 straddle the devices; the window takes a halo at P = 2
    # and the gathered path at P = 8.
    "nsa": (_nsa(), (2, 8)),
    "stickbreaking_attn": (_stickbreaking(), (2, 8)),
    # The gate sums entering a device: from the previous device, or from
    # several (a document over devices 4 to 7 of 8).
    "forgetting_attn": (_forgetting(), (2, 8)),
    # A halo with the gates for 8 tokens per device, the gathered path for 4.
    "forgetting_attn_window": (_forgetting(window_size=6), (4, 8)),
    # Blocks of 3: 2 keys before a device's first query for its own block,
    # at 16 and at 4 tokens per device.
    "moba": (_moba(), (2, 8)),
    # Earlier devices' keys moved across the later devices' reflections
    # (without documents, across up to 7 devices: PLAIN).
    "path_attn": (_path(), (2, 8)),
    "path_attn_without_gate": (_path(gate=False), ()),
    # Grouped value heads and erase gates up to 2.
    "gdn2": (_gdn2(), (2, 8)),
    # The core splits the interleaved sub-steps: a device's share is its
    # tokens' sub-steps.
    "gated_delta_product": (_gated_delta_product(), (2, 8)),
    # The max state entering a device: composed over the devices before it,
    # reset where a document starts at a device boundary.
    "mlstm": (_mlstm(), (2, 8)),
    # Grouped value heads, an erase key apart from the written key, read
    # before the decay.
    "comba": (_comba(), (2, 8)),
    # The angles summed over the devices before, the next device's first
    # trapezoid weight, then the core's split.
    "mamba3": (_mamba3(), (2, 8)),
    # The same on R T sub-steps: a device's share is its tokens' sub-steps.
    "mamba3_mimo": (_mamba3_mimo(), (2, 8)),
    # The core's split of the block terms (stacked on the batch axis),
    # with positions from an offset and 5 levels for 35 positions.
    "log_linear_attn": (_log_linear(), (2, 8)),
    # The solve is not linear in the state: each device runs the chunk form
    # from the state the combine gives it.
    "mesa_net": (_mesa_net(), (2, 8)),
}

# name: the P of a run without initial state and segment ids (compared with
# the same compiled reference given a zero state and one document).
PLAIN = {"gla": 4, "gated_delta_rule": 2, "linear_scan": 8,
         "causal_conv1d": 2, "token_shift": 4, "sliding_window_attn": 4,
         "stickbreaking_attn": 4, "forgetting_attn": 4, "moba": 4,
         "path_attn": 4, "path_attn_without_gate": 8}


def _vjp(fn, diff, segment_ids, cotangents):
  """``(outputs, gradients)`` of ``fn`` for the given cotangents."""
  def forward(d):
    d = dict(d)
    return fn(d.pop("initial_state", None), segment_ids, **d)

  out, vjp = jax.vjp(forward, diff)
  return out, vjp(cotangents)[0]


@functools.lru_cache(maxsize=None)
def _case(name):
  """Inputs, initial state and cotangents of a case, made once."""
  (make, fn), _ = CASES[name]
  inputs, state_shape = make()
  initial = None if state_shape is None else _normal(9, state_shape)
  shapes = jax.eval_shape(lambda x: fn(initial, IDS, **x), inputs)
  rng = np.random.default_rng(7)
  cotangents = jax.tree.map(
      lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), shapes)
  return inputs, initial, cotangents


@functools.lru_cache(maxsize=None)
def _reference(name):
  """The single-device chunk form, compiled once per case (segment ids and
  initial state are arguments)."""
  return jit(functools.partial(_vjp, CASES[name][0][1]))


def _check(name, parts, plain=False, fn=None):
  """The split form of case ``name`` (or ``fn`` on its inputs) on ``parts``
  devices against the case's single-device reference."""
  if fn is None:
    (_, fn), _ = CASES[name]
  inputs, initial, cotangents = _case(name)
  diff, ids = dict(inputs), None if plain else jnp.asarray(IDS)
  if initial is not None and not plain:
    diff["initial_state"] = initial
  reference = dict(diff)
  if initial is not None:
    reference["initial_state"] = jnp.zeros_like(initial) if plain else initial
  expected = _reference(name)(reference, jnp.zeros_like(IDS) if plain
                              else ids, cotangents)
  if plain and initial is not None:
    del expected[1]["initial_state"]
  with jax.set_mesh(mesh(parts)):
    assert context_parallel.sequence_parallel_size() == parts
    actual = jit(functools.partial(_vjp, fn))(diff, ids, cotangents)
  paths = jax.tree_util.tree_flatten_with_path(expected)[0]
  assert len(paths) == len(jax.tree.leaves(actual))
  for (path, want), got in zip(paths, jax.tree.leaves(actual)):
    err = rel_rms(got, want)
    assert err <= TOL, (f"{name} P={parts} plain={plain} "
                        f"{jax.tree_util.keystr(path)}: relative RMS error "
                        f"{err:.2e}")


# Each case at its largest device count in the fast suite, at the smaller
# ones (and without initial state and segment ids) in the slow suite; so
# are the cases whose split another case runs through the same code: MIMO
# Mamba-3's by Mamba-3's, the FoX window's by FoX's (and the kernels'
# test below), the gated-linear variants that only prepare the core's
# inputs or read its outputs token by token by GLA's and Simple GLA's, the
# delta-rule ones by KDA's and Gated DeltaNet's.
SLOW_CASES = ("mamba3_mimo", "forgetting_attn_window", "linear_attn",
              "retention", "based", "mesa_net", "comba", "gdn2")
SPLIT_RUNS = [pytest.param(name, parts, id=f"{name}-P{parts}",
                           marks=() if parts == max(CASES[name][1])
                           and name not in SLOW_CASES else pytest.mark.slow)
              for name in sorted(CASES) for parts in CASES[name][1]]


@pytest.mark.parametrize("name, parts", SPLIT_RUNS)
def test_split_matches_single_device(name, parts):
  _check(name, parts)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PLAIN))
def test_split_without_state_or_documents(name):
  _check(name, PLAIN[name], plain=True)


@pytest.mark.slow
def test_hybrid_lm_loss_and_gradients_match_single_device():
  """A 4-layer LM of GLA, Gated DeltaNet, Mamba-2 and attention split over
  ``sequence`` (slow: the LM-level split is in the fast suite through
  tests/train/test_train.py's data x sequence training)."""
  from flax import nnx
  from lin_attn_jax.models import LM, LMConfig

  config = LMConfig(
      vocab_size=64, d_model=32, n_layers=4, n_heads=2,
      mixer=("gla", "gated_deltanet", "mamba2", "softmax_attn"),
      mixer_options={"gla": {"chunk_size": CHUNK},
                     "gated_deltanet": {"chunk_size": CHUNK,
                                        "zero_init_gate": False},
                     "mamba2": {"chunk_size": CHUNK, "d_state": 8},
                     "softmax_attn": {"block_size": CHUNK}})
  graphdef, params = nnx.split(LM(config, rngs=nnx.Rngs(0)))
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 64, (B, T + 1)),
                       jnp.int32)
  ids = jnp.asarray(np.concatenate([IDS, IDS[:, -1:]], axis=1))

  def loss(params, tokens, ids):
    logits = nnx.merge(graphdef, params)(tokens[:, :-1],
                                         segment_ids=ids[:, :-1])
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

  expected = jit(jax.value_and_grad(loss))(params, tokens, ids)
  with jax.set_mesh(mesh(4)):
    step = jit(jax.value_and_grad(loss)).lower(params, tokens, ids).compile()
    actual = step(params, tokens, ids)
    hlo = step.as_text()
  # The split ran: the chunk forms exchanged summaries and halos.
  assert "all-gather" in hlo and "collective-permute" in hlo
  assert rel_rms(actual[0], expected[0]) <= TOL
  flat = [jnp.concatenate([x.ravel() for x in jax.tree.leaves(g)])
          for g in (actual[1], expected[1])]
  assert rel_rms(*flat) <= TOL
  # Per parameter, 3e-5: the two-entry gradients of Gated DeltaNet's decay
  # parameters (A_log, dt_bias) are sums over every token of terms of both
  # signs; the single-device chunk form itself moves them by 9e-6 when its
  # chunk size goes from 4 to 8. The other parameters measured within 6e-6.
  paths = jax.tree_util.tree_flatten_with_path(expected[1])[0]
  for (path, want), got in zip(paths, jax.tree.leaves(actual[1])):
    err = rel_rms(got, want)
    assert err <= 3 * TOL, f"{jax.tree_util.keystr(path)}: {err:.2e}"


def test_explicit_axis_name_and_mesh():
  """The split functions take another axis name and an explicit mesh."""
  a = jax.nn.sigmoid(_normal(0, (B, T, 6)))
  b = _normal(1, (B, T, 6))
  expected = ops.chunk_linear_scan(a, b, output_final_state=True,
                                   segment_ids=IDS, chunk_size=CHUNK)
  sp = jax.make_mesh((4,), ("sp",), axis_types=(AxisType.Auto,),
                     devices=jax.devices()[:4])
  actual = jit(lambda a, b: ops.context_parallel_linear_scan(
      a, b, output_final_state=True, segment_ids=IDS, chunk_size=CHUNK,
      axis_name="sp", mesh=sp))(a, b)
  for got, want in zip(actual, expected):
    assert rel_rms(got, want) <= TOL


def test_sequence_parallel_size():
  assert context_parallel.sequence_parallel_size() == 1
  with jax.set_mesh(mesh(4)):
    assert context_parallel.sequence_parallel_size() == 4
    sizes = []

    def inside(x):
      sizes.append(context_parallel.sequence_parallel_size())
      return x

    jax.shard_map(inside, in_specs=jax.P(None, "sequence"),
                  out_specs=jax.P(None, "sequence"),
                  axis_names={"sequence"})(jnp.zeros((B, T)))
    assert sizes == [1]                    # the axis is manual inside


def test_bad_inputs_raise():
  x = _normal(0, (B, 30, H, K))
  g = _log_gate(1, (B, 30, H, K))
  with jax.set_mesh(mesh(4)):
    with pytest.raises(ValueError, match="T must be a multiple of 4"):
      ops.chunk_gla(x, x, x, g)
    with pytest.raises(ValueError, match="must be >= 5"):
      ops.chunk_causal_conv1d(_normal(0, (B, 16, 6)), _normal(1, (6, 6)))
    with pytest.raises(ValueError, match="Linformer cannot split"):
      ops.linformer_attn(x, x, x, jnp.ones((4, 30)), jnp.ones((4, 30)))
  with pytest.raises(ValueError, match="needs a mesh with the axis 'sp'"):
    ops.context_parallel_gated_linear(x, x, x, g, axis_name="sp")


def test_linformer_layer_refuses_a_sequence_axis():
  from flax import nnx
  from lin_attn_jax.layers import Linformer

  layer = Linformer(16, 2, rngs=nnx.Rngs(0), max_len=T, projected_length=8)
  with jax.set_mesh(mesh(2)):
    with pytest.raises(ValueError, match="Linformer cannot split"):
      layer(_normal(0, (B, T, 16)))


def test_pallas_kernels_run_per_device():
  """``impl="pallas"`` (interpret mode here) runs inside the split."""
  q, k, v = (_normal(i, (1, T, H, 16)) for i in range(3))
  initial = _normal(9, (1, H, 16, 16))
  ids = IDS[:1]
  gates = {"gla": (ops.chunk_gla, (_log_gate(3, (1, T, H, 16)),), {}),
           "gated_delta_rule": (ops.chunk_gated_delta_rule,
                                (_log_gate(3, (1, T, H)),
                                 jax.nn.sigmoid(_normal(4, (1, T, H)))),
                                {"use_qk_l2norm": True})}
  for name, (form, extra, kw) in gates.items():
    def run(impl, form=form, kw=kw):
      return jit(lambda *a: form(
          *a, initial_state=initial, output_final_state=True,
          segment_ids=ids, chunk_size=CHUNK, impl=impl, **kw))(q, k, v,
                                                               *extra)
    expected = run("xla")
    with jax.set_mesh(mesh(2)):
      actual = run("pallas")
    for got, want in zip(actual, expected):
      assert rel_rms(got, want) <= TOL, name


def test_forgetting_attn_kernels_in_the_split():
  """``impl="pallas"`` under a ``sequence`` axis: the halo path (P = 4, 8
  tokens per device, ``w - 1 = 5``) runs the kernels on every device (and
  per batch shard: ``data = 2``), the gathered path (P = 8) stays XLA; both
  equal the single-device XLA form, outputs and gradients."""
  _, fn = _forgetting(window_size=6, impl="pallas")
  for parts, kernels in ((4, True), (8, False)):
    with jax.set_mesh(mesh(parts)):
      jaxpr = jax.make_jaxpr(functools.partial(_vjp, fn))(
          _case("forgetting_attn_window")[0], jnp.asarray(IDS),
          _case("forgetting_attn_window")[2])
    assert ("pallas_call" in str(jaxpr)) == kernels, parts
    _check("forgetting_attn_window", parts, fn=fn)
