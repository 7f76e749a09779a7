"""A decoder language model with one token mixer per layer.

Pre-norm blocks: ``x + mixer(rms_norm(x))`` then ``x + swiglu(rms_norm(x))``,
a final RMSNorm, and tied or untied output embeddings. ``mixer`` names a
class in ``lin_attn_jax.layers.MIXERS``, one for every layer or one per
layer (hybrids); ``"none"`` is a block without a mixer (and without its norm),
``x + mlp(norm(x))`` alone, as Nemotron-H's MLP layers.

Options for the block structure of published models (``LMConfig``):
``mlp`` picks the MLP, for every layer or one per layer as ``mixer`` does
(``"swiglu"``; ``"geglu"``, RecurrentGemma's; ``"rwkv6"``/``"rwkv7"``,
RWKV's channel mixing with its own token shift; ``"relu2"``, the
non-gated ``down(relu(up(x))^2)`` of Nemotron-H; ``"moe"``, the
mixture-of-experts SwiGLU of ``layers/moe.py`` with ``moe_options``;
``"none"``, Mamba's block ``x + mixer(norm(x))`` alone) and ``mlp_bias``
its biases; ``multipliers`` fixed factors at named points of the blocks; ``norm`` the kind of every norm (``"rms"`` or ``"layer"``,
LayerNorm with a bias, RWKV's); ``embed_norm`` a norm of the embeddings
before the first block (RWKV's ``ln0``); ``embed_scale`` a factor on the
embeddings (RecurrentGemma's ``sqrt(D)``); ``logits_soft_cap`` ``c tanh(z /
c)`` on the logits; ``residual_from_norm`` MiniMax's blocks, whose residual
terms are the norms' outputs. ``LMConfig.to_dict`` / ``from_dict`` give its
JSON form.

Example:
  >>> config = LMConfig(vocab_size=256, d_model=64, n_layers=4, n_heads=4,
  ...                   mixer=("gla", "gla", "gla", "softmax_attn"))
  >>> lm = LM(config, rngs=nnx.Rngs(0))
  >>> lm(jnp.zeros((2, 16), jnp.int32)).shape
  (2, 16, 256)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax import sharding
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, check_mode
from lin_attn_jax.layers.moe import MoE, load_balancing_loss
from lin_attn_jax.ops.common import checks


def _frozen_options(options) -> tuple:
  """``{name: {key: value}}`` as nested sorted tuples (hashable)."""
  if isinstance(options, tuple):
    return options
  return tuple(sorted((name, tuple(sorted(dict(kw).items())))
                      for name, kw in dict(options).items()))


# Rematerialisation settings: None is no remat, otherwise the jax.checkpoint
# policy (``None`` inside the tuple recomputes everything).
REMAT_POLICIES = {
    "none": None,
    "block": (None,),
    "block_save_dots": (
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,),
}

# The logical axes of the residual stream between blocks.
RESIDUAL_AXES = ("batch", "length", "act_embed")


@dataclasses.dataclass(frozen=True)
class LMConfig:
  """Shape and mixers of an ``LM``."""

  # Number of token ids; logits have this last dimension.
  vocab_size: int = 256
  # Model width D.
  d_model: int = 128
  # Number of blocks.
  n_layers: int = 2
  # Heads of every mixer (each mixer splits D over them its own way).
  n_heads: int = 4
  # A name in layers.MIXERS for every layer, or a tuple of names, one per
  # layer; a shorter tuple whose length divides n_layers is repeated
  # (("gla", "gla", "gla", "softmax_attn") over 8 layers is two periods).
  # "none" is a layer without a mixer: its block is the MLP alone.
  mixer: str | tuple[str, ...] = "gla"
  # Keyword arguments per mixer name, e.g. {"gla": {"chunk_size": 32}};
  # stored as sorted tuples so that the config stays hashable. The key
  # "n_heads" gives that mixer its own head count in place of n_heads (a
  # hybrid whose Mamba-2 layers have more heads than its attention).
  mixer_options: Any = ()
  # Hidden width of the dense MLP; None means 8/3 * d_model rounded up to a
  # multiple of 8.
  mlp_dim: int | None = None
  # Output logits use the transposed input embedding when True.
  tie_embeddings: bool = True
  # Epsilon of every norm of the blocks (and of the final norm).
  norm_eps: float = 1e-6
  # Dtype of the computation (activations); states stay float32.
  dtype: Any = jnp.float32
  # Dtype the parameters are stored in.
  param_dtype: Any = jnp.float32
  # The MLP of every block: "swiglu", "geglu" (gelu(tanh approx.) gate),
  # "rwkv6" / "rwkv7" (RWKV channel mixing, squared ReLU, token shift; RWKV-6
  # adds a sigmoid receptance gate), "relu2" (down(relu(up(x))^2), no gate,
  # Nemotron-H's), "moe" (layers/moe.py, with
  # moe_options), or "none" (no MLP and no MLP norm); or a tuple of these,
  # one per layer, repeated like mixer's (("swiglu", "moe") over 4 layers:
  # experts in layers 1 and 3).
  mlp: str | tuple[str, ...] = "swiglu"
  # Keyword arguments of every "moe" MLP (layers.moe.MoE: n_experts, top_k
  # and expert_dim, required; score, normalize_topk, routed_scale,
  # selection_bias, n_groups, topk_groups, shared_dim, shared_gate); stored
  # as sorted tuples so that the config stays hashable.
  moe_options: Any = ()
  # Fixed factors at named points, {name: factor}, 1 where not given:
  # "mixer_out" and "mlp_out" multiply the mixer's and the MLP's outputs
  # before they join the residual stream, "mixer_residual" and
  # "mlp_residual" the residual term they join (MiniMax's alpha factors),
  # "logits" the logits (before the soft cap), "mlp_gate" the gate
  # projection of the "swiglu"/"geglu" MLP before its activation (Falcon-H1's
  # gate multiplier). A block's factor may be given per layer, as a tuple
  # repeated like mixer's (MiniMax's factors differ between its lightning
  # and softmax layers). A model that needs a factor elsewhere adds its name
  # to MULTIPLIERS and applies it at one place. Stored as sorted tuples.
  multipliers: Any = ()
  # The residual term of each half of a block is the norm's output instead
  # of its input: x <- norm(x) + mixer(norm(x)) (times the multipliers);
  # MiniMax's blocks.
  residual_from_norm: bool = False
  # The MLP's projections have biases.
  mlp_bias: bool = False
  # Kind of every norm: "rms" (RMSNorm) or "layer" (LayerNorm with a bias).
  norm: str = "rms"
  # A norm of the embeddings before the first block (RWKV's ln0).
  embed_norm: bool = False
  # Factor on the embeddings (None: 1).
  embed_scale: float | None = None
  # Logits become c * tanh(logits / c) (None: no cap).
  logits_soft_cap: float | None = None
  # Rematerialisation of the blocks in training (calls without a cache):
  # "none" keeps every activation for the backward pass; "block" keeps only
  # each block's input and recomputes the rest; "block_save_dots" also keeps
  # the results of matmuls without batch dimensions (less recomputation).
  remat: str = "none"

  def __post_init__(self):
    object.__setattr__(self, "mixer_options",
                       _frozen_options(self.mixer_options))
    for name in ("moe_options", "multipliers"):
      value = getattr(self, name)
      if not isinstance(value, tuple):
        object.__setattr__(self, name, tuple(sorted(
            (k, _tuples(v)) for k, v in dict(value).items())))
    if isinstance(self.mlp, list):
      object.__setattr__(self, "mlp", tuple(self.mlp))
    unknown = sorted(set(self.layer_mlps) - set(MLP_KINDS))
    if unknown:
      raise ValueError(f"mlp must be one of {MLP_KINDS} (or a tuple of "
                       f"them), got {unknown}")
    self._check_moe_options()
    for name, value in self.multipliers:
      if name not in MULTIPLIERS:
        raise ValueError(f"unknown multiplier {name!r}; known: "
                         f"{MULTIPLIERS}")
      per_layer = isinstance(value, tuple) and name in BLOCK_MULTIPLIERS
      values = value if per_layer else (value,)
      if not values or any(not isinstance(v, (int, float))
                           or isinstance(v, bool) for v in values):
        raise ValueError(f"multiplier {name!r} must be a number (or, for "
                         f"{BLOCK_MULTIPLIERS}, a tuple of numbers, one per "
                         f"layer), got {value!r}")
      if per_layer and self.n_layers % len(values):
        raise ValueError(f"multiplier {name!r} has {len(values)} values, "
                         f"which does not divide n_layers = "
                         f"{self.n_layers}")
    if self.norm not in NORM_KINDS:
      raise ValueError(f"norm must be one of {NORM_KINDS}, got {self.norm!r}")
    for name in ("embed_scale", "logits_soft_cap"):
      value = getattr(self, name)
      if value is not None and not (isinstance(value, (int, float))
                                    and value > 0):
        raise ValueError(f"{name} must be a positive number or None, got "
                         f"{value!r}")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
      checks.positive_int(name, getattr(self, name))
    names = self.layer_mixers
    unknown = sorted(set(names) - set(MIXERS) - {"none"})
    if unknown:
      raise ValueError(f"unknown mixer(s) {unknown}; known: {sorted(MIXERS)}")
    unknown = sorted(set(dict(self.mixer_options)) - set(MIXERS))
    if unknown:
      raise ValueError(f"mixer_options names unknown mixer(s) {unknown}")
    empty = [i for i, (mixer, mlp) in enumerate(zip(names, self.layer_mlps))
             if mixer == "none" and mlp == "none"]
    if empty:
      raise ValueError(f"layers {empty} have mixer 'none' and mlp 'none': a "
                       "block needs one of them")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat must be one of {sorted(REMAT_POLICIES)}, got "
                       f"{self.remat!r}")

  @property
  def layer_mixers(self) -> tuple[str, ...]:
    """The mixer name of every layer."""
    if isinstance(self.mixer, str):
      return (self.mixer,) * self.n_layers
    names = tuple(self.mixer)
    if not names or self.n_layers % len(names):
      raise ValueError(f"mixer has {len(names)} names, which does not divide "
                       f"n_layers = {self.n_layers}")
    return names * (self.n_layers // len(names))

  @property
  def layer_mlps(self) -> tuple[str, ...]:
    """The MLP kind of every layer."""
    if isinstance(self.mlp, str):
      return (self.mlp,) * self.n_layers
    kinds = tuple(self.mlp)
    if not kinds or self.n_layers % len(kinds):
      raise ValueError(f"mlp has {len(kinds)} kinds, which does not divide "
                       f"n_layers = {self.n_layers}")
    return kinds * (self.n_layers // len(kinds))

  @property
  def n_experts(self) -> int | None:
    """Experts of the "moe" MLPs, None when no layer has one."""
    if "moe" not in self.layer_mlps:
      return None
    return dict(self.moe_options)["n_experts"]

  def multiplier(self, name: str, layer: int | None = None) -> float:
    """The factor ``multipliers`` gives ``name`` (1.0 when absent), in
    block ``layer`` for a factor given per layer."""
    value = dict(self.multipliers).get(name, 1.0)
    if isinstance(value, tuple):
      if layer is None:
        raise ValueError(f"multiplier {name!r} is given per layer; name the "
                         "layer")
      value = value[layer % len(value)]
    return float(value)

  def _check_moe_options(self):
    options = dict(self.moe_options)
    accepted = set(inspect.signature(MoE.__init__).parameters) - {
        "self", "d_model", "rngs", "dtype", "param_dtype"}
    unknown = sorted(set(options) - accepted)
    if unknown:
      raise ValueError(f"unknown moe_options {unknown}; known: "
                       f"{sorted(accepted)}")
    if "moe" in self.layer_mlps:
      missing = sorted({"n_experts", "top_k", "expert_dim"} - set(options))
      if missing:
        raise ValueError(f"mlp 'moe' needs moe_options {missing}")

  def options_for(self, name: str) -> dict:
    return dict(dict(self.mixer_options).get(name, ()))

  @property
  def hidden_dim(self) -> int:
    if self.mlp_dim is not None:
      return self.mlp_dim
    return 8 * math.ceil(8 * self.d_model / 3 / 8)

  def to_dict(self) -> dict:
    """The config as JSON-ready values (dtypes by name, tuples as lists)."""
    out = {}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if field.name in ("dtype", "param_dtype"):
        value = jnp.dtype(value).name
      elif field.name == "mixer_options":
        value = {name: {k: _jsonable(v) for k, v in kw} for name, kw in value}
      elif field.name in ("moe_options", "multipliers"):
        value = {k: _jsonable(v) for k, v in value}
      else:
        value = _jsonable(value)
      out[field.name] = value
    return out

  @classmethod
  def from_dict(cls, data: Mapping) -> "LMConfig":
    """The inverse of ``to_dict``; unknown keys raise ``ValueError``."""
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
      raise ValueError(f"unknown LMConfig field(s) {unknown}")
    kw = dict(data)
    for name in ("dtype", "param_dtype"):
      if name in kw:
        kw[name] = jnp.dtype(kw[name]).type
    for name in ("mixer", "mlp"):
      if isinstance(kw.get(name), list):
        kw[name] = tuple(kw[name])
    if "mixer_options" in kw:
      kw["mixer_options"] = {name: {k: _tuples(v) for k, v in dict(opts).items()}
                             for name, opts in dict(kw["mixer_options"]).items()}
    return cls(**kw)


MLP_KINDS = ("swiglu", "geglu", "rwkv6", "rwkv7", "relu2", "moe", "none")
# Factors of the blocks (these may be given per layer) and of the rest.
BLOCK_MULTIPLIERS = ("mixer_out", "mlp_out", "mixer_residual", "mlp_residual")
MULTIPLIERS = BLOCK_MULTIPLIERS + ("logits", "mlp_gate")
NORM_KINDS = ("rms", "layer")


def _aux_outputs(stats) -> dict:
  """``LM``'s ``aux`` from the ``router_stats`` of its MoE layers."""
  if not stats:
    return {"load_balancing_loss": jnp.zeros((), jnp.float32),
            "expert_load": jnp.zeros((0, 0), jnp.float32)}
  return {"load_balancing_loss": load_balancing_loss(stats),
          "expert_load": jnp.stack([s["load"] for s in stats])}


def _jsonable(value):
  if isinstance(value, tuple):
    return [_jsonable(v) for v in value]
  return value


def _tuples(value):
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  return value


def make_norm(config: LMConfig, *, rngs):
  """The norm of ``config.norm`` over ``d_model`` (scale, and a bias for
  LayerNorm)."""
  kw = dict(dtype=config.dtype, param_dtype=config.param_dtype, rngs=rngs)
  if config.norm == "rms":
    return modules.rms_norm(config.d_model, eps=config.norm_eps, **kw)
  return nnx.LayerNorm(
      config.d_model, epsilon=config.norm_eps, use_fast_variance=False,
      scale_init=modules.partitioned(nnx.initializers.ones_init(),
                                     ("embed",)),
      bias_init=modules.partitioned(nnx.initializers.zeros_init(),
                                    ("embed",)), **kw)


class SwiGLU(nnx.Module):
  """``down(silu(gate(x)) * up(x))`` (Shazeer, 2020); ``activation="gelu"``
  is GeGLU with the tanh approximation (Griffin's gated MLP).
  ``gate_scale`` multiplies ``gate(x)`` before the activation (1)."""

  def __init__(self, d_model: int, hidden: int, *, rngs, dtype, param_dtype,
               activation: str = "silu", use_bias: bool = False,
               gate_scale: float = 1.0):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype,
              use_bias=use_bias)
    self.activation, self.gate_scale = activation, float(gate_scale)
    self.gate = modules.dense(d_model, hidden, ("embed", "mlp"), **kw)
    self.up = modules.dense(d_model, hidden, ("embed", "mlp"), **kw)
    self.down = modules.dense(hidden, d_model, ("mlp", "embed"), **kw)

  def __call__(self, x):
    gate = self.gate(x)
    if self.gate_scale != 1.0:
      gate = gate * jnp.asarray(self.gate_scale, gate.dtype)
    gate = (jax.nn.silu(gate) if self.activation == "silu"
            else jax.nn.gelu(gate, approximate=True))
    return self.down(gate * self.up(x))


class SquaredReLUMLP(nnx.Module):
  """``down(relu(up(x))^2)``, no gate (So et al. 2021's squared ReLU;
  Nemotron-H's MLP, transformers' ``relu2``)."""

  def __init__(self, d_model: int, hidden: int, *, rngs, dtype, param_dtype,
               use_bias: bool = False):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype,
              use_bias=use_bias)
    self.up = modules.dense(d_model, hidden, ("embed", "mlp"), **kw)
    self.down = modules.dense(hidden, d_model, ("mlp", "embed"), **kw)

  def __call__(self, x):
    return self.down(jnp.square(jax.nn.relu(self.up(x))))


class RWKVChannelMix(nnx.Module):
  """RWKV's channel mixing (Peng et al. 2024, 2025): with ``d = x' - x``
  (``x'`` the previous token), ``value(relu(key(x + d mu_k))^2)``, times
  ``sigmoid(receptance(x + d mu_r))`` when ``receptance`` (RWKV-6).

  ``mu`` start at 0.5, the projections LeCun normal. Its cache is the last
  token, ``[B, D]`` float32.
  """

  def __init__(self, d_model: int, hidden: int, *, receptance: bool, rngs,
               dtype, param_dtype, use_bias: bool = False):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype,
              use_bias=use_bias)
    half = modules.constant_init(0.5)
    self.key_mix = modules.param(rngs, half, (d_model,), ("embed",),
                                 param_dtype)
    self.key = modules.dense(d_model, hidden, ("embed", "mlp"), **kw)
    self.value = modules.dense(hidden, d_model, ("mlp", "embed"), **kw)
    if receptance:
      self.receptance_mix = modules.param(rngs, half, (d_model,), ("embed",),
                                          param_dtype)
      self.receptance = modules.dense(d_model, d_model, ("embed", "embed"),
                                      **kw)
    else:
      self.receptance = None

  def __call__(self, x, ctx: Context, last=None):
    """``x: [B, T, D]`` -> ``(y [B, T, D], x[:, -1] float32)``."""
    shifted, last = modules.token_shift(x, ctx, last)
    delta = shifted - x                                         # [B, T, D]
    key = self.key(x + delta * self.key_mix[...].astype(x.dtype))
    y = self.value(jnp.square(jax.nn.relu(key)))
    if self.receptance is not None:
      r = self.receptance(x + delta * self.receptance_mix[...].astype(x.dtype))
      y = jax.nn.sigmoid(r) * y
    return y, last


class Block(nnx.Module):
  """``x + mixer(norm(x))``, then ``x + mlp(norm(x))`` (no second half with
  the MLP ``"none"``, no first half with the mixer ``"none"``); the
  ``"mixer_out"`` and ``"mlp_out"`` multipliers scale the new terms,
  ``"mixer_residual"`` and ``"mlp_residual"`` the residual ones, which are
  ``norm(x)`` instead of ``x`` with ``residual_from_norm``.

  Its cache is the mixer's, or ``{"mixer_cache": ..., "mlp_shift": [B, D]}``
  with RWKV channel mixing. A ``"moe"`` MLP appends its ``router_stats`` to
  ``carry["router_stats"]`` (a tuple, one entry per such layer so far).
  """

  def __init__(self, config: LMConfig, mixer: str, *, rngs: nnx.Rngs,
               layer_index: int = 0):
    mlp = config.layer_mlps[layer_index]
    self.mixer_scale = config.multiplier("mixer_out", layer_index)
    self.mlp_scale = config.multiplier("mlp_out", layer_index)
    self.mixer_residual = config.multiplier("mixer_residual", layer_index)
    self.mlp_residual = config.multiplier("mlp_residual", layer_index)
    self.residual_from_norm = config.residual_from_norm
    kw = dict(dtype=config.dtype, param_dtype=config.param_dtype)
    if mixer == "none":
      self.mixer_norm = self.mixer = None
    else:
      self.mixer_norm = make_norm(config, rngs=rngs)
      options = config.options_for(mixer)
      # A mixer kind may have heads of its own (the attention layers of a
      # hybrid beside its linear ones).
      n_heads = options.pop("n_heads", config.n_heads)
      # Mixers whose inits depend on depth (RWKV) learn where they are.
      accepted = inspect.signature(MIXERS[mixer].__init__).parameters
      for name, value in (("layer_index", layer_index),
                          ("n_layers", config.n_layers)):
        if name in accepted:
          options.setdefault(name, value)
      self.mixer = MIXERS[mixer](config.d_model, n_heads, rngs=rngs, **kw,
                                 **options)
    self.shift_mlp = mlp in ("rwkv6", "rwkv7")
    self.moe = mlp == "moe"
    if mlp == "none":
      self.mlp_norm = self.mlp = None
      return
    self.mlp_norm = make_norm(config, rngs=rngs)
    if self.moe:
      self.mlp = MoE(config.d_model, rngs=rngs, **kw,
                     **dict(config.moe_options))
      return
    kw.update(rngs=rngs, use_bias=config.mlp_bias)
    if self.shift_mlp:
      self.mlp = RWKVChannelMix(config.d_model, config.hidden_dim,
                                receptance=mlp == "rwkv6", **kw)
    elif mlp == "relu2":
      self.mlp = SquaredReLUMLP(config.d_model, config.hidden_dim, **kw)
    else:
      self.mlp = SwiGLU(config.d_model, config.hidden_dim, **kw,
                        activation="silu" if mlp == "swiglu" else "gelu",
                        gate_scale=config.multiplier("mlp_gate"))

  def init_cache(self, batch_size: int, max_len: int, dtype):
    """The mixer's cache; ``{}`` for a block without a mixer."""
    if self.mixer is None:
      return {}
    cache = self.mixer.init_cache(batch_size, max_len, dtype)
    if not self.shift_mlp:
      return cache
    d = self.mlp.key_mix.shape[0]
    return {"mixer_cache": cache,
            "mlp_shift": jnp.zeros((batch_size, d), jnp.float32)}

  def __call__(self, x, *, segment_ids, mode, cache, carry=None):
    """Returns ``(x, new cache or None, carry)``."""
    mixer_cache = (cache["mixer_cache"] if self.shift_mlp and cache is not None
                   else cache)
    if self.mixer is None:
      new_mixer_cache = None if cache is None else {}
    else:
      normed = self.mixer_norm(x)
      y, new_mixer_cache, carry = self.mixer.run(
          normed, segment_ids=segment_ids, mode=mode, cache=mixer_cache,
          carry=carry)
      x = self._joined(x, normed, y, self.mixer_residual, self.mixer_scale)
    if self.mlp is None:
      return x, new_mixer_cache, carry
    normed = self.mlp_norm(x)
    if self.moe:
      mask = None if segment_ids is None else segment_ids != 0
      y, stats = self.mlp(normed, mask)
      carry = dict(carry or {})
      carry["router_stats"] = carry.get("router_stats", ()) + (stats,)
      return (self._joined(x, normed, y, self.mlp_residual, self.mlp_scale),
              new_mixer_cache, carry)
    if not self.shift_mlp:
      y = self.mlp(normed)
      return (self._joined(x, normed, y, self.mlp_residual, self.mlp_scale),
              new_mixer_cache, carry)
    restart = None
    if cache is not None and segment_ids is not None:
      restart = segment_ids[:, 0] != mixer_cache["segment_id"]
    ctx = Context(mode, segment_ids, None, restart=restart)
    y, shift = self.mlp(normed, ctx,
                        None if cache is None else cache["mlp_shift"])
    new_cache = (None if cache is None
                 else {"mixer_cache": new_mixer_cache, "mlp_shift": shift})
    return (self._joined(x, normed, y, self.mlp_residual, self.mlp_scale),
            new_cache, carry)

  def _joined(self, x, normed, y, residual: float, scale: float):
    """``residual * (normed if residual_from_norm else x) + scale * y``."""
    base = normed if self.residual_from_norm else x
    return self._scaled(base, residual) + self._scaled(y, scale)

  @staticmethod
  def _scaled(y, factor: float):
    return y if factor == 1.0 else y * jnp.asarray(factor, y.dtype)


class LM(nnx.Module):
  """Decoder language model; see the module docstring."""

  def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
    self.config = config
    d = config.d_model
    self.embed = nnx.Embed(
        config.vocab_size, d, dtype=config.dtype,
        param_dtype=config.param_dtype,
        embedding_init=modules.partitioned(
            nnx.initializers.normal(stddev=d ** -0.5), ("vocab", "embed")),
        rngs=rngs)
    self.embed_norm = (make_norm(config, rngs=rngs) if config.embed_norm
                       else None)
    self.blocks = nnx.List([
        Block(config, name, rngs=rngs, layer_index=i)
        for i, name in enumerate(config.layer_mixers)])
    self.final_norm = make_norm(config, rngs=rngs)
    self.lm_head = (None if config.tie_embeddings else modules.dense(
        d, config.vocab_size, ("embed", "vocab"), rngs=rngs,
        dtype=config.dtype, param_dtype=config.param_dtype))

  def init_cache(self, batch_size: int, max_len: int, dtype=None):
    """One cache per layer (a tuple) for up to ``max_len`` tokens per row."""
    dtype = self.config.dtype if dtype is None else dtype
    return tuple(block.init_cache(batch_size, max_len, dtype)
                 for block in self.blocks)

  def __call__(self, tokens, *, segment_ids=None, mode: str = "chunk",
               cache=None, return_aux: bool = False):
    """Logits ``[B, T, vocab]`` float32, or ``(logits, cache)`` with a cache;
    ``return_aux`` appends the auxiliary outputs ``aux`` (``(logits, aux)``,
    ``(logits, cache, aux)``).

    Args:
      tokens: ``[B, T]`` int token ids.
      segment_ids: ``[B, T]`` int, packed documents (no attention or state
        crosses a change of id).
      mode: ``"chunk"``, ``"parallel"`` or ``"recurrent"``: the form every
        mixer runs.
      cache: from ``init_cache`` or a previous call. Any ``T`` is a prefill
        from the cached state; ``T = 1`` decodes with the step forms.
      return_aux: also return ``aux``, a dict of the mixture-of-experts
        layers' ``"load_balancing_loss"`` (float32 scalar,
        ``layers.moe.load_balancing_loss`` over them all and the tokens
        whose segment id is not 0; 0 without such layers) and
        ``"expert_load"`` (``[L_moe, E]`` float32, the counted tokens each
        layer sent to each expert; ``[0, 0]`` without such layers).
    """
    check_mode(mode)
    checks.check_rank("tokens", tokens, 2, "[B, T]")
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
      raise ValueError(f"tokens must be integer ids, got "
                       f"{jnp.result_type(tokens)}")
    if cache is not None and len(cache) != len(self.blocks):
      raise ValueError(f"cache has {len(cache)} layers, the model "
                       f"{len(self.blocks)}; build it with LM.init_cache")
    x = self.embed(tokens)                                      # [B, T, D]
    if self.config.embed_scale is not None:
      x = x * jnp.asarray(self.config.embed_scale, x.dtype)
    if self.embed_norm is not None:
      x = self.embed_norm(x)
    x = sharding.constrain(x, RESIDUAL_AXES)
    new_cache, carry = [], {}
    remat = REMAT_POLICIES[self.config.remat]
    for i, block in enumerate(self.blocks):
      if cache is None and remat is not None:

        def run(block, x, segment_ids, carry):
          x, _, carry = block(x, segment_ids=segment_ids, mode=mode,
                              cache=None, carry=carry)
          return x, carry

        x, carry = nnx.remat(run, policy=remat[0])(block, x, segment_ids,
                                                   carry)
        layer_cache = None
      else:
        x, layer_cache, carry = block(
            x, segment_ids=segment_ids, mode=mode,
            cache=None if cache is None else cache[i], carry=carry)
      x = sharding.constrain(x, RESIDUAL_AXES)
      new_cache.append(layer_cache)
    x = self.final_norm(x)
    if self.lm_head is None:
      logits = self.embed.attend(x)
    else:
      logits = self.lm_head(x)
    logits = logits.astype(jnp.float32)                         # [B, T, vocab]
    if self.config.multiplier("logits") != 1.0:
      logits = logits * self.config.multiplier("logits")
    if self.config.logits_soft_cap is not None:
      cap = self.config.logits_soft_cap
      logits = cap * jnp.tanh(logits / cap)
    out = (logits,) if cache is None else (logits, tuple(new_cache))
    if return_aux:
      out += (_aux_outputs(carry.get("router_stats", ())),)
    return out[0] if len(out) == 1 else out

  def balance_experts(self, expert_load, rate: float) -> None:
    """Auxiliary-loss-free balancing of every mixture-of-experts layer with
    a selection bias (``MoE.balance``), from ``expert_load [L_moe, E]`` (the
    ``aux`` of a call, in layer order)."""
    layers = [block.mlp for block in self.blocks if block.moe]
    for layer, load in zip(layers, expert_load):
      layer.balance(load, rate)

  def generate(self, prompt, max_new_tokens: int, *, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None,
               rng=None, prompt_lengths=None, eos_id: int | None = None):
    """Continues ``prompt: [B, P]`` by ``max_new_tokens`` sampled tokens.

    The prompt is prefilled with the chunk forms, then every new token is
    decoded with the step forms (``lax.scan``), in one program compiled once
    per shape and sampling setting. ``temperature=0`` is greedy; otherwise
    logits are divided by it, cut to the ``top_k`` largest and to the
    smallest set of probability at least ``top_p``, and sampled with
    ``rng`` (a PRNG key, required).

    Prompts of different lengths share a batch by left padding:
    ``prompt_lengths: [B]`` int, each row's prompt is its last
    ``prompt_lengths[b]`` tokens and what comes before is padding (any id).
    The padding is a document of its own (segment id 0, the prompt 1), so
    no state or attention crosses into the prompt, and the positions of a
    row start so that its first prompt token is at position 0: a row
    continues as its prompt alone would, up to float rounding. (Sparse
    Transformer patterns lie on the cache's own positions, which count
    the padding.) With ``eos_id``, a row that has produced it repeats it.

    Returns:
      ``[B, P + max_new_tokens]`` int32: the prompt and its continuation.
    """
    prompt, lengths, rng, options = self._generation_args(
        prompt, max_new_tokens, temperature, top_k, top_p, rng,
        prompt_lengths, eos_id)
    graphdef, state = nnx.split(self)
    return _generate(graphdef, state, prompt, lengths, rng,
                     max_new_tokens=max_new_tokens, **options)

  def stream(self, prompt, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, rng=None,
             prompt_lengths=None, eos_id: int | None = None):
    """``generate`` one step at a time: yields the ``[B]`` int32 tokens of
    every step as soon as they are computed (the same tokens ``generate``
    returns, for the same arguments). Stopping early is closing the
    generator."""
    prompt, lengths, rng, options = self._generation_args(
        prompt, max_new_tokens, temperature, top_k, top_p, rng,
        prompt_lengths, eos_id)
    graphdef, state = nnx.split(self)
    keys = jax.random.split(rng, max_new_tokens)
    token, cache = _start_jit(graphdef, state, prompt, lengths, keys[0],
                              max_new_tokens=max_new_tokens, **options)
    yield token
    done = _finished(token, options["eos_id"])
    for key in keys[1:]:
      token, cache, done = _next_jit(graphdef, state, token, cache, done,
                                     lengths, key, **options)
      yield token

  def _generation_args(self, prompt, max_new_tokens, temperature, top_k,
                       top_p, rng, prompt_lengths, eos_id):
    checks.check_rank("prompt", prompt, 2, "[B, P]")
    if not jnp.issubdtype(jnp.result_type(prompt), jnp.integer):
      raise ValueError(f"prompt must be integer ids, got "
                       f"{jnp.result_type(prompt)}")
    checks.positive_int("max_new_tokens", max_new_tokens)
    sampling = Sampling(float(temperature), top_k, top_p)
    if sampling.temperature > 0 and rng is None:
      raise ValueError("sampling with temperature > 0 needs rng (a PRNG key)")
    rng = jax.random.key(0) if rng is None else rng
    batch, length = checks.shape_of(prompt)
    if prompt_lengths is not None:
      prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
      checks.check_shape("prompt_lengths", prompt_lengths, (batch,), "[B]")
      values = checks.concrete(prompt_lengths)
      if values is not None and not np.all((values >= 1) & (values <= length)):
        raise ValueError(f"prompt_lengths must be in [1, P = {length}], got "
                         f"{values.tolist()}")
    if eos_id is not None and not 0 <= eos_id < self.config.vocab_size:
      raise ValueError(f"eos_id must be in [0, vocab_size = "
                       f"{self.config.vocab_size}), got {eos_id}")
    options = dict(sampling=sampling, eos_id=eos_id)
    return jnp.asarray(prompt, jnp.int32), prompt_lengths, rng, options


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How ``LM.generate`` picks a token from the logits."""

  # 0 is greedy (argmax); otherwise logits are divided by it.
  temperature: float = 0.0
  # Keep only the k largest logits (None: all).
  top_k: int | None = None
  # Keep the smallest set of tokens whose probability reaches top_p (None:
  # all).
  top_p: float | None = None

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    checks.positive_int("top_k", self.top_k, allow_none=True)
    if self.top_p is not None and not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

  def __call__(self, logits, key):
    """``logits: [B, vocab]`` float32 -> ``[B]`` int32 token ids."""
    if self.temperature == 0:
      return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / self.temperature
    if self.top_k is not None:
      kth = jax.lax.top_k(logits, min(self.top_k, logits.shape[-1]))[0][:, -1:]
      logits = jnp.where(logits < kth, -jnp.inf, logits)
    if self.top_p is not None:
      ordered = jnp.sort(logits, axis=-1)[:, ::-1]              # [B, vocab]
      probs = jax.nn.softmax(ordered, axis=-1)
      # A token stays if the tokens ranked above it hold less than top_p.
      keep = jnp.cumsum(probs, axis=-1) - probs < self.top_p
      cutoff = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1,
                       keepdims=True)
      logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def _left_padded(cache, pads):
  """``cache`` (of ``LM.init_cache``) with every layer's position starting
  at ``-pads: [B]``, so that token ``pads[b]`` of row ``b`` is at 0."""
  if not cache:
    return cache
  if "mixer_cache" in cache:
    return {**cache, "mixer_cache": _left_padded(cache["mixer_cache"], pads)}
  return {**cache, "position": cache["position"] - pads}


def _prompt_segments(lengths, batch: int, length: int):
  """``[B, T]`` int32 segment ids: 0 on left padding, 1 on the prompt."""
  steps = jnp.arange(length, dtype=jnp.int32)[None]             # [1, P]
  return (steps >= length - lengths[:, None]).astype(jnp.int32)


def _finished(token, eos_id):
  return (jnp.zeros(token.shape, bool) if eos_id is None
          else token == eos_id)                                 # [B]


def _start(model, prompt, lengths, key, *, max_new_tokens, sampling, eos_id):
  """Prefill; returns the first new token ``[B]`` and the cache."""
  del eos_id
  batch, length = prompt.shape
  cache = model.init_cache(batch, length + max_new_tokens)
  segment_ids = None
  if lengths is not None:
    segment_ids = _prompt_segments(lengths, batch, length)
    cache = tuple(_left_padded(c, length - lengths) for c in cache)
  logits, cache = model(prompt, segment_ids=segment_ids, cache=cache,
                        mode="chunk")
  return sampling(logits[:, -1], key), cache


def _next(model, token, cache, done, lengths, key, *, sampling, eos_id):
  """One decoding step; returns ``(token [B], cache, done [B])``."""
  segment_ids = (None if lengths is None
                 else jnp.ones((token.shape[0], 1), jnp.int32))
  logits, cache = model(token[:, None], segment_ids=segment_ids, cache=cache)
  following = sampling(logits[:, -1], key)
  if eos_id is not None:
    following = jnp.where(done, eos_id, following)
  return following, cache, done | _finished(following, eos_id)


def _merged(fn):
  """``fn(model, ...)`` as a jitted function of ``(graphdef, state, ...)``."""

  def run(graphdef, state, *args, **kw):
    return fn(nnx.merge(graphdef, state), *args, **kw)

  return jax.jit(run, static_argnames=("graphdef", "max_new_tokens",
                                       "sampling", "eos_id"))


_start_jit = _merged(_start)
_next_jit = _merged(_next)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens",
                                             "sampling", "eos_id"))
def _generate(graphdef, state, prompt, lengths, rng, *, max_new_tokens: int,
              sampling: Sampling, eos_id: int | None):
  model = nnx.merge(graphdef, state)
  keys = jax.random.split(rng, max_new_tokens)
  options = dict(sampling=sampling, eos_id=eos_id)
  first, cache = _start(model, prompt, lengths, keys[0],
                        max_new_tokens=max_new_tokens, **options)

  def step(carry, key):
    token, cache, done = carry
    token, cache, done = _next(model, token, cache, done, lengths, key,
                               **options)
    return (token, cache, done), token

  _, rest = jax.lax.scan(step, (first, cache, _finished(first, eos_id)),
                         keys[1:])
  return jnp.concatenate([prompt, first[:, None], rest.T], axis=1)
