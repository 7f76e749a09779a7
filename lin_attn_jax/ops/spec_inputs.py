"""Random inputs of every op in the registry (``registry.py``).

Every maker is called as ``make(key, dims, strong)`` with a
``jax.random.PRNGKey``, a ``registry.Dims`` and whether the gates or decays
are strong, and returns the keyword arguments of the op's forms: the
sequence inputs, the parameters, an ``initial_state`` (where the op has one)
and ``segment_ids`` (packed documents, a new one with probability 0.05 per
token).

"Strong" gates reach per-token log-decays of about -60 (gated linear and
delta rule: ``log_sigmoid(x) / 0.05``) or down to -30 (the diagonal SSMs);
gentle ones stay near -0.1 to -1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax import feature_maps
from lin_attn_jax.ops.mamba3 import (pack_mamba3_mimo_state,
                                     pack_mamba3_state)
from lin_attn_jax.ops.mlstm import pack_mlstm_state
from lin_attn_jax.ops.mesa_net import pack_mesa_net_state

_F32 = jnp.float32
# Diagonal SSMs: the strongest per-token log-decay of the strong inputs.
STRONGEST_LOG_DECAY = -30.0
# Based: the dimension of the Taylor feature map's input.
BASED_FEATURE_DIM = 8
# Short convolutions: the kernel width.
CONV_WIDTH = 4
# Linformer: the rank of the key and value projections.
LINFORMER_RANK = 16
# Agent Attention: the agent tokens. Nystromformer: the landmarks.
AGENT_NUM = 7
NUM_LANDMARKS = 8
# Stick-breaking attention: the queries' scale in the strong inputs, so that
# the logits ``q . k / sqrt(K)`` reach ``|z| ~ 30`` (saturated sigmoids).
STRONG_LOGITS = 30.0


def segments(key, batch, length):
  """Segment ids ``[B, T]`` int32: a new document with probability 0.05."""
  starts = jax.random.bernoulli(key, 0.05, (batch, length)).astype(jnp.int32)
  return jnp.cumsum(starts, axis=1)


def _normal(key, shape, scale=1.0, shift=0.0):
  return shift + scale * jax.random.normal(key, shape, _F32)


def _log_gate(key, shape, strong):
  """``log_sigmoid(N(0, 1))``, divided by 0.05 when strong."""
  g = jax.nn.log_sigmoid(jax.random.normal(key, shape, jnp.float32))
  return g / 0.05 if strong else g


def qkv(key, dims, dim_k=None, state_k=None, state_v=None):
  dim_k = dims.dim_k if dim_k is None else dim_k
  kq, kk, kv, ks, kseg = jax.random.split(key, 5)
  b, t, h, dv = dims.batch, dims.length, dims.heads, dims.dim_v
  return dict(
      q=jax.random.normal(kq, (b, t, h, dim_k), jnp.float32),
      k=jax.random.normal(kk, (b, t, h, dim_k), jnp.float32),
      v=jax.random.normal(kv, (b, t, h, dv), jnp.float32),
      initial_state=jax.random.normal(
          ks, (b, h, state_k or dim_k, state_v or dv), jnp.float32),
      segment_ids=segments(kseg, b, t),
  )


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


def linear_attn(key, dims, strong, normalize=False):
  del strong
  key, ks = jax.random.split(key)
  inputs = qkv(key, dims, state_v=dims.dim_v + 1 if normalize else None)
  if normalize:
    inputs["q"] = feature_maps.elu_plus_one(inputs["q"])
    inputs["k"] = feature_maps.elu_plus_one(inputs["k"])
    inputs["initial_state"] = _normalized_state(
        ks, dims, feature_maps.elu_plus_one, dims.dim_k)
  return inputs


def simple_gla(key, dims, strong):
  key, kg = jax.random.split(key)
  inputs = qkv(key, dims)
  inputs["g"] = _log_gate(kg, (dims.batch, dims.length, dims.heads), strong)
  return inputs


def gla(key, dims, strong):
  key, kg = jax.random.split(key)
  inputs = qkv(key, dims)
  inputs["g"] = _log_gate(
      kg, (dims.batch, dims.length, dims.heads, dims.dim_k), strong)
  return inputs


def retention(key, dims, strong):
  del strong
  return qkv(key, dims)


def based(key, dims, strong):
  del strong
  dk = BASED_FEATURE_DIM
  key, ks = jax.random.split(key)
  inputs = qkv(key, dims, dim_k=dk, state_k=1 + dk + dk * dk,
                state_v=dims.dim_v + 1)
  inputs["q"] = 0.5 * inputs["q"]
  inputs["k"] = 0.5 * inputs["k"]
  inputs["initial_state"] = _normalized_state(
      ks, dims, lambda x: feature_maps.taylor(0.5 * x), dk)
  return inputs


def mlstm(key, dims, strong):
  """q, k, v, segment ids, the gate pre-activations ``i`` (``N(0, 1)``, or
  ``N(0, 8)`` when strong: input gates from ``e^-20`` to ``e^20``) and
  ``f`` (``N(2, 1)``, forget gates near 0.9; when strong ``N(0, 20)``, log
  forget gates down to about -60), and an initial ``[C | n | m]`` with
  ``m ~ N(0, 1)``."""
  key, ki, kf, kn, km = jax.random.split(key, 5)
  inputs = qkv(key, dims)
  b, t, h, dk = dims.batch, dims.length, dims.heads, dims.dim_k
  inputs["i"] = _normal(ki, (b, t, h), 8.0 if strong else 1.0)
  inputs["f"] = (_normal(kf, (b, t, h), 20.0) if strong
                 else _normal(kf, (b, t, h), 1.0, 2.0))
  inputs["initial_state"] = pack_mlstm_state(
      inputs["initial_state"], _normal(kn, (b, h, dk)),
      _normal(km, (b, h)))
  return inputs

def mamba3(key, dims, strong):
  """q, k, v, segment ids, time steps ``dt = softplus(N(-1, 1))`` (about
  0.05 to 2.5), log-decays ``g = A dt`` with ``A = -exp(N(0, 0.5))``
  (strong: ``g`` uniform in (-30, 0)), ``trap ~ N(0, 1)`` (strong: ``N(0,
  4)``, lambda near 0 or 1), ``A = K / 4`` rotation rates ``N(0, 1)``
  (strong: ``N(0, 3)``, saturated tanh), and an initial state with every
  part random."""
  keys = jax.random.split(key, 7)
  inputs = qkv(keys[0], dims)
  b, t, h, dk, dv = (dims.batch, dims.length, dims.heads, dims.dim_k,
                     dims.dim_v)
  n_angles = max(dk // 4, 1)
  dt = jax.nn.softplus(_normal(keys[1], (b, t, h), shift=-1.0))
  inputs["g"] = (jax.random.uniform(keys[2], (b, t, h), _F32,
                                    STRONGEST_LOG_DECAY, 0.0) if strong
                 else -jnp.exp(_normal(keys[2], (b, t, h), 0.5)) * dt)
  inputs["dt"] = dt
  inputs["trap"] = _normal(keys[3], (b, t, h), 4.0 if strong else 1.0)
  inputs["angles"] = _normal(keys[4], (b, t, h, n_angles),
                             3.0 if strong else 1.0)
  inputs["initial_state"] = pack_mamba3_state(
      inputs["initial_state"], _normal(keys[5], (b, h, dk)),
      _normal(keys[6], (b, h, dv)))
  return inputs



MAMBA3_MIMO_RANK = 2


def mamba3_mimo(key, dims, strong):
  """``mamba3``'s gates, angles and segment ids with ``R = 2`` queries,
  keys and values per token and head, and an initial state with every part
  random."""
  inputs = mamba3(key, dims, strong)
  keys = jax.random.split(jax.random.fold_in(key, 1), 6)
  b, t, h, dk, dv = (dims.batch, dims.length, dims.heads, dims.dim_k,
                     dims.dim_v)
  r = MAMBA3_MIMO_RANK
  inputs["q"] = _normal(keys[0], (b, t, h, r, dk))
  inputs["k"] = _normal(keys[1], (b, t, h, r, dk))
  inputs["v"] = _normal(keys[2], (b, t, h, r, dv))
  inputs["initial_state"] = pack_mamba3_mimo_state(
      _normal(keys[3], (b, h, dk, dv)), _normal(keys[4], (b, h, r, dk)),
      _normal(keys[5], (b, h, r, dv)))
  return inputs


def log_linear_attn(key, dims, strong):
  """q, k, v, segment ids, a scalar log-gate ``g``, ``L = bits(T - 1) +
  1`` levels (the positions past ``2^(L-1)`` that the offset reaches share
  the top level) with ``level_scales`` uniform in (0, 2), an initial state
  ``[B, H, L, K, V]`` and each row's ``offset`` in ``[0, T / 2]``."""
  key, kg, kl, ks, ko = jax.random.split(key, 5)
  inputs = qkv(key, dims)
  b, t, h = dims.batch, dims.length, dims.heads
  levels = (t - 1).bit_length() + 1
  inputs["g"] = _log_gate(kg, (b, t, h), strong)
  inputs["level_scales"] = jax.random.uniform(kl, (b, t, h, levels), _F32,
                                              0.0, 2.0)
  inputs["initial_state"] = _normal(ks, (b, h, levels, dims.dim_k,
                                         dims.dim_v))
  inputs["offset"] = jax.random.randint(ko, (b,), 0, t // 2 + 1, jnp.int32)
  return inputs

def delta_rule(key, dims, strong, gate=None):
  key, kg, kb = jax.random.split(key, 3)
  inputs = qkv(key, dims)
  b, t, h = dims.batch, dims.length, dims.heads
  beta = jax.nn.sigmoid(jax.random.normal(kb, (b, t, h), jnp.float32))
  inputs["beta"] = 2.0 * beta if strong else beta
  if gate == "scalar":
    inputs["g"] = _log_gate(kg, (b, t, h), strong)
  elif gate == "channel":
    inputs["g"] = _log_gate(kg, (b, t, h, dims.dim_k), strong)
  return inputs


def gdn2(key, dims, strong):
  """Gated DeltaNet-2: q, k, v, a log-decay ``g`` per key channel, the
  erase gate ``b`` in (0, 1) (in (0, 2) when strong) per key channel and
  the write gate ``w`` in (0, 1) per value channel."""
  key, kg, kb, kw = jax.random.split(key, 4)
  inputs = qkv(key, dims)
  b, t, h = dims.batch, dims.length, dims.heads
  inputs["g"] = _log_gate(kg, (b, t, h, dims.dim_k), strong)
  erase = jax.nn.sigmoid(jax.random.normal(kb, (b, t, h, dims.dim_k), _F32))
  inputs["b"] = 2.0 * erase if strong else erase
  inputs["w"] = jax.nn.sigmoid(jax.random.normal(kw, (b, t, h, dims.dim_v),
                                                 _F32))
  return inputs


def comba(key, dims, strong):
  """Comba: the delta rule's inputs with a scalar log-decay ``g [B, T, H]``
  and an erase key ``p = 0.8 k + 0.6 n`` (``n`` normal, independent of k:
  near k, as the layer's ``sigmoid(d) k``, but not parallel to it); beta
  in (0, 1), in (0, 2) when strong."""
  key, kp = jax.random.split(key)
  inputs = delta_rule(key, dims, strong, gate="scalar")
  noise = jax.random.normal(kp, inputs["k"].shape, _F32)
  inputs["p"] = 0.8 * inputs["k"] + 0.6 * noise
  return inputs


def gated_delta_product(key, dims, strong, householder=2):
  """The delta rule's inputs with ``householder`` keys, values and steps
  per token (``k [B, T, N, H, K]``, ``v [B, T, N, H, V]``, ``beta [B, T, N,
  H]``) and a scalar log-decay ``g [B, T, H]`` per token."""
  key, kk, kv, kb = jax.random.split(key, 4)
  inputs = delta_rule(key, dims, strong, gate="scalar")
  b, t, h, n = dims.batch, dims.length, dims.heads, householder
  inputs["k"] = jax.random.normal(kk, (b, t, n, h, dims.dim_k), _F32)
  inputs["v"] = jax.random.normal(kv, (b, t, n, h, dims.dim_v), _F32)
  beta = jax.nn.sigmoid(jax.random.normal(kb, (b, t, n, h), _F32))
  inputs["beta"] = 2.0 * beta if strong else beta
  return inputs


def rwkv6(key, dims, strong):
  key, kw, ku = jax.random.split(key, 3)
  inputs = qkv(key, dims)
  inputs["r"] = inputs.pop("q")
  inputs["w"] = _log_gate(
      kw, (dims.batch, dims.length, dims.heads, dims.dim_k), strong)
  inputs["u"] = jax.random.normal(ku, (dims.heads, dims.dim_k), jnp.float32)
  return inputs


def rwkv7(key, dims, strong):
  key, kw, kappa_key, rate_key = jax.random.split(key, 4)
  inputs = qkv(key, dims)
  shape = (dims.batch, dims.length, dims.heads, dims.dim_k)
  inputs["r"] = inputs.pop("q")
  inputs["w"] = _log_gate(kw, shape, strong)
  kappa = jax.random.normal(kappa_key, shape, jnp.float32)
  kappa = kappa / jnp.linalg.norm(kappa, axis=-1, keepdims=True)
  rate = jax.nn.sigmoid(jax.random.normal(rate_key, shape, jnp.float32))
  inputs["a"] = -kappa
  inputs["b"] = kappa * rate
  return inputs


def _log_decay(key, shape, strong):
  """Gentle: ``log_sigmoid(N(2, 1))`` (about -0.1); strong: U(-30, 0)."""
  if strong:
    return jax.random.uniform(key, shape, _F32, STRONGEST_LOG_DECAY, 0.0)
  return jax.nn.log_sigmoid(_normal(key, shape, shift=2.0))


def linear_scan(key, dims, strong):
  ka, kb, ks, kseg = jax.random.split(key, 4)
  b, t, d = dims.batch, dims.length, dims.dim_v
  return dict(a=jnp.exp(_log_decay(ka, (b, t, d), strong)),
              b=_normal(kb, (b, t, d)), initial_state=_normal(ks, (b, d)),
              segment_ids=segments(kseg, b, t))


def selective_scan(key, dims, strong):
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
              segment_ids=segments(keys[9], b, t))


def ssd_groups(heads):
  return heads // 2 if heads > 1 and heads % 2 == 0 else 1


def ssd(key, dims, strong):
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
              segment_ids=segments(keys[8], b, t))


def causal_conv1d(key, dims, strong):
  del strong
  kx, kw, kb, ks, kseg = jax.random.split(key, 5)
  b, t, d = dims.batch, dims.length, dims.dim_v
  return dict(x=_normal(kx, (b, t, d)),
              weight=_normal(kw, (d, CONV_WIDTH), 0.5),
              bias=_normal(kb, (d,)),
              initial_state=_normal(ks, (b, CONV_WIDTH - 1, d)),
              segment_ids=segments(kseg, b, t))


def shift_ssm(key, dims, strong):
  del strong
  ku, kc, kd, ks, kseg = jax.random.split(key, 5)
  b, t, d, n = dims.batch, dims.length, dims.dim_v, dims.dim_k
  return dict(u=_normal(ku, (b, t, d)), C=_normal(kc, (d, n), n ** -0.5),
              D=_normal(kd, (d,)), initial_state=_normal(ks, (b, n - 1, d)),
              segment_ids=segments(kseg, b, t))


def s4d(key, dims, strong):
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
              segment_ids=segments(keys[8], b, t))


def rg_lru(key, dims, strong):
  keys = jax.random.split(key, 6)
  b, t, d = dims.batch, dims.length, dims.dim_v
  # softplus(a_param) = -log(a); strong: c * r * softplus(a_param) up to 30.
  low, high = (0.5, 3.75) if strong else (1e-3, 0.1)
  softplus = jax.random.uniform(keys[3], (d,), _F32, low, high)
  return dict(x=_normal(keys[0], (b, t, d)), a_gate=_normal(keys[1], (b, t, d)),
              x_gate=_normal(keys[2], (b, t, d)),
              a_param=jnp.log(jnp.expm1(softplus)),
              initial_state=_normal(keys[4], (b, d)),
              segment_ids=segments(keys[5], b, t))


def hgrn(key, dims, strong):
  kx, kg, ks, kseg = jax.random.split(key, 4)
  b, t, d = dims.batch, dims.length, dims.dim_v
  g = _log_decay(kg, (b, t, d), strong)
  return dict(x=(-jnp.expm1(g)) * _normal(kx, (b, t, d)), g=g,
              initial_state=_normal(ks, (b, d)),
              segment_ids=segments(kseg, b, t))


def attention(key, dims, strong, global_tokens=False, projections=False):
  del strong
  kq, kk, kv, kseg, ke, kf = jax.random.split(key, 6)
  b, t, h, dk, dv = (dims.batch, dims.length, dims.heads, dims.dim_k,
                     dims.dim_v)
  hkv = h // 2 if h % 2 == 0 else h
  inputs = dict(q=jax.random.normal(kq, (b, t, h, dk), jnp.float32),
                k=jax.random.normal(kk, (b, t, hkv, dk), jnp.float32),
                v=jax.random.normal(kv, (b, t, hkv, dv), jnp.float32))
  if projections:
    shape = (LINFORMER_RANK, t)
    inputs["e"] = jax.random.normal(ke, shape, jnp.float32) * t ** -0.5
    inputs["f"] = jax.random.normal(kf, shape, jnp.float32) * t ** -0.5
  else:
    inputs["segment_ids"] = segments(kseg, b, t)
  if global_tokens:
    # Static positions (not an array): the first token and the middle one.
    inputs["global_positions"] = (0, t // 2)
  return inputs


def stickbreaking_attn(key, dims, strong):
  """``attention``'s inputs (keys and values with half the query heads when
  ``H`` is even, segment ids); strong: queries times ``STRONG_LOGITS``."""
  inputs = attention(key, dims, strong)
  if strong:
    inputs["q"] = STRONG_LOGITS * inputs["q"]
  return inputs


def forgetting_attn(key, dims, strong):
  """``attention``'s q, k, v and segment ids, and log forget gates ``g [B,
  T, H]``: ``log_sigmoid(N(0, 1) + 2)`` (about -0.2 per token), or
  ``log_sigmoid(N(0, 1)) / 0.05`` when strong (down to about -60)."""
  key, key_g = jax.random.split(key)
  inputs = attention(key, dims, strong)
  shape = (dims.batch, dims.length, dims.heads)
  inputs["g"] = (_log_gate(key_g, shape, True) if strong
                 else jax.nn.log_sigmoid(_normal(key_g, shape, shift=2.0)))
  return inputs


def nsa(key, dims, strong):
  """Attention inputs (keys and values with half the query heads when
  ``Dims.heads`` is even) and the three gates of native sparse attention,
  sigmoids of normals. Normal queries and keys leave no two blocks of a
  ranking with equal probabilities."""
  del strong
  key, kg = jax.random.split(key)
  inputs = attention(key, dims, False)
  shape = (dims.batch, dims.length, dims.heads)
  for name, kx in zip(("g_cmp", "g_slc", "g_swa"), jax.random.split(kg, 3)):
    inputs[name] = jax.nn.sigmoid(jax.random.normal(kx, shape, _F32))
  return inputs


def moba(key, dims, strong):
  """Grouped-query attention inputs (as ``attention``) whose documents are
  a few MoBA blocks long: a new one with probability 0.02 per token. Gates
  of normal inputs are distinct with probability 1, so the forms select the
  same blocks (a tie would be broken the same way by all of them, but a
  gate computed in another order of sums could break it otherwise)."""
  inputs = attention(key, dims, strong)
  kseg = jax.random.fold_in(key, 1)
  starts = jax.random.bernoulli(kseg, 0.02, (dims.batch, dims.length))
  inputs["segment_ids"] = jnp.cumsum(starts.astype(jnp.int32), axis=1)
  return inputs


def path_attn(key, dims, strong):
  """Attention inputs (keys and values with half the query heads when
  ``Dims.heads`` is even), unit-norm Householder directions ``w [B, T,
  Hkv, K]``, strengths ``beta = 2 sigmoid(N(0, 1))`` in (0, 2) and a forget
  gate ``g [B, T, H]`` per query head, as the PaTH layer makes them."""
  key, kw, kb, kg = jax.random.split(key, 4)
  inputs = attention(key, dims, strong)
  shape = inputs["k"].shape
  w = jax.random.normal(kw, shape, _F32)
  inputs["w"] = w / jnp.linalg.norm(w, axis=-1, keepdims=True)
  inputs["beta"] = 2.0 * jax.nn.sigmoid(jax.random.normal(kb, shape[:-1],
                                                          _F32))
  inputs["g"] = _log_gate(kg, inputs["q"].shape[:-1], strong)
  return inputs


def mesa_net(key, dims, strong, prior=16):
  """q, k, v (the forms L2-normalise q and k), segment ids, log-decays
  ``g [B, T, H]`` (``_log_gate``), ``beta = sigmoid(N(0, 1))``, ``lamb =
  softplus(N(0, 1)) + 0.25 [H, K]`` (the reference layer's lower bound)
  and an initial ``[H^kk | H^kv]`` whose ``H^kk`` a MesaNet can have
  reached (symmetric, ``sum_j beta_j k_j k_j^T`` over ``prior`` unit keys;
  the CG needs ``H^kk + diag(lamb)`` positive definite)."""
  key, kg, kb, kl, kp, kw = jax.random.split(key, 6)
  inputs = qkv(key, dims)
  b, t, h, dk = dims.batch, dims.length, dims.heads, dims.dim_k
  inputs["g"] = _log_gate(kg, (b, t, h), strong)
  inputs["beta"] = jax.nn.sigmoid(_normal(kb, (b, t, h)))
  inputs["lamb"] = jax.nn.softplus(_normal(kl, (h, dk))) + 0.25
  keys = _normal(kp, (b, prior, h, dk))
  keys = keys / jnp.linalg.norm(keys, axis=-1, keepdims=True)
  weights = jax.nn.sigmoid(_normal(kw, (b, prior, h)))
  h_kk = jnp.einsum("bjhk,bjh,bjhl->bhkl", keys, weights, keys)
  inputs["initial_state"] = pack_mesa_net_state(
      h_kk, inputs["initial_state"][..., :dims.dim_v])
  return inputs


def relu_linear_attn(key, dims, strong):
  """q, k, v and segment ids (no state: the op is not causal)."""
  del strong
  inputs = qkv(key, dims)
  del inputs["initial_state"]
  return inputs


def agent_attn(key, dims, strong):
  """q, k, v (one document per row) and the agent biases ``[H, N, T]``,
  ``[H, T, N]`` of ``AGENT_NUM`` agents, of the scale of the scores."""
  del strong
  kqkv, ka, kq = jax.random.split(key, 3)
  inputs = qkv(kqkv, dims)
  del inputs["initial_state"], inputs["segment_ids"]
  h, t = dims.heads, dims.length
  inputs["agent_bias"] = jax.random.normal(ka, (h, AGENT_NUM, t), jnp.float32)
  inputs["query_bias"] = jax.random.normal(kq, (h, t, AGENT_NUM), jnp.float32)
  return inputs


def nystrom_attn(key, dims, strong):
  """q, k, v (one document per row)."""
  del strong
  inputs = qkv(key, dims)
  del inputs["initial_state"], inputs["segment_ids"]
  return inputs
