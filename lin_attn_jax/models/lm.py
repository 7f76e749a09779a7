"""A decoder language model with one token mixer per layer.

Pre-norm blocks: ``x + mixer(rms_norm(x))`` then ``x + swiglu(rms_norm(x))``,
a final RMSNorm, and tied or untied output embeddings. ``mixer`` names a
class in ``lin_attn_jax.layers.MIXERS``, one for every layer or one per
layer (hybrids).

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
from flax import nnx

from lin_attn_jax import sharding
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import check_mode
from lin_attn_jax.ops.common import checks


def _frozen_options(options) -> tuple:
  """``{name: {key: value}}`` as nested sorted tuples (hashable)."""
  if isinstance(options, tuple):
    return options
  return tuple(sorted((name, tuple(sorted(dict(kw).items())))
                      for name, kw in dict(options).items()))


def _jsonable(value):
  if isinstance(value, tuple):
    return [_jsonable(v) for v in value]
  return value


def _tupled(value):
  if isinstance(value, list):
    return tuple(_tupled(v) for v in value)
  return value


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
  mixer: str | tuple[str, ...] = "gla"
  # Keyword arguments per mixer name, e.g. {"gla": {"chunk_size": 32}};
  # stored as sorted tuples so that the config stays hashable.
  mixer_options: Any = ()
  # Hidden width of the SwiGLU MLP; None means 8/3 * d_model rounded up to a
  # multiple of 8; 0 leaves the MLP out (blocks of a mixer only, as in
  # Zoology's MQAR models).
  mlp_dim: int | None = None
  # Output logits use the transposed input embedding when True.
  tie_embeddings: bool = True
  # Epsilon of every RMSNorm of the blocks.
  norm_eps: float = 1e-6
  # Dtype of the computation (activations); states stay float32.
  dtype: Any = jnp.float32
  # Dtype the parameters are stored in.
  param_dtype: Any = jnp.float32
  # Rematerialisation of the blocks in training (calls without a cache):
  # "none" keeps every activation for the backward pass; "block" keeps only
  # each block's input and recomputes the rest; "block_save_dots" also keeps
  # the results of matmuls without batch dimensions (less recomputation).
  remat: str = "none"

  def __post_init__(self):
    object.__setattr__(self, "mixer_options",
                       _frozen_options(self.mixer_options))
    for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if self.mlp_dim is not None and (not isinstance(self.mlp_dim, int)
                                     or self.mlp_dim < 0):
      raise ValueError(f"mlp_dim must be None or an int >= 0, got "
                       f"{self.mlp_dim!r}")
    names = self.layer_mixers
    unknown = sorted(set(names) - set(MIXERS))
    if unknown:
      raise ValueError(f"unknown mixer(s) {unknown}; known: {sorted(MIXERS)}")
    unknown = sorted(set(dict(self.mixer_options)) - set(MIXERS))
    if unknown:
      raise ValueError(f"mixer_options names unknown mixer(s) {unknown}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat must be one of {sorted(REMAT_POLICIES)}, got "
                       f"{self.remat!r}")

  def to_dict(self) -> dict:
    """Plain JSON-able values (dtypes by name, tuples as lists)."""
    out = {}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if field.name in ("dtype", "param_dtype"):
        value = jnp.dtype(value).name
      elif field.name == "mixer_options":
        value = {name: {k: _jsonable(v) for k, v in kw} for name, kw in value}
      else:
        value = _jsonable(value)
      out[field.name] = value
    return out

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "LMConfig":
    """The inverse of ``to_dict``; unknown fields raise ``ValueError``."""
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"unknown LMConfig fields {unknown}")
    values = dict(values)
    for name in ("dtype", "param_dtype"):
      if name in values:
        values[name] = jnp.dtype(values[name]).type
    if isinstance(values.get("mixer"), list):
      values["mixer"] = tuple(values["mixer"])
    if "mixer_options" in values:
      values["mixer_options"] = {
          name: {k: _tupled(v) for k, v in dict(kw).items()}
          for name, kw in dict(values["mixer_options"]).items()}
    return cls(**values)

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

  def options_for(self, name: str) -> dict:
    return dict(dict(self.mixer_options).get(name, ()))

  @property
  def hidden_dim(self) -> int:
    if self.mlp_dim is not None:
      return self.mlp_dim
    return 8 * math.ceil(8 * self.d_model / 3 / 8)


class SwiGLU(nnx.Module):
  """``down(silu(gate(x)) * up(x))`` (Shazeer, 2020)."""

  def __init__(self, d_model: int, hidden: int, *, rngs, dtype, param_dtype):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.gate = modules.dense(d_model, hidden, ("embed", "mlp"), **kw)
    self.up = modules.dense(d_model, hidden, ("embed", "mlp"), **kw)
    self.down = modules.dense(hidden, d_model, ("mlp", "embed"), **kw)

  def __call__(self, x):
    return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
  """``x + mixer(norm(x))``, then ``x + mlp(norm(x))`` (no MLP when
  ``mlp_dim = 0``)."""

  def __init__(self, config: LMConfig, mixer: str, *, rngs: nnx.Rngs,
               layer_index: int = 0):
    kw = dict(dtype=config.dtype, param_dtype=config.param_dtype)
    self.mixer_norm = modules.rms_norm(config.d_model, eps=config.norm_eps,
                                       rngs=rngs, **kw)
    options = config.options_for(mixer)
    # Mixers whose inits depend on depth (RWKV) learn where they are.
    accepted = inspect.signature(MIXERS[mixer].__init__).parameters
    for name, value in (("layer_index", layer_index),
                        ("n_layers", config.n_layers)):
      if name in accepted:
        options.setdefault(name, value)
    self.mixer = MIXERS[mixer](config.d_model, config.n_heads, rngs=rngs,
                               **kw, **options)
    self.mlp_norm = self.mlp = None
    if config.hidden_dim:
      self.mlp_norm = modules.rms_norm(config.d_model, eps=config.norm_eps,
                                       rngs=rngs, **kw)
      self.mlp = SwiGLU(config.d_model, config.hidden_dim, rngs=rngs, **kw)

  def __call__(self, x, *, segment_ids, mode, cache):
    h = self.mixer_norm(x)
    if cache is None:
      y = self.mixer(h, segment_ids=segment_ids, mode=mode)
    else:
      y, cache = self.mixer(h, segment_ids=segment_ids, mode=mode, cache=cache)
    x = x + y
    if self.mlp is None:
      return x, cache
    return x + self.mlp(self.mlp_norm(x)), cache


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
    self.blocks = nnx.List([
        Block(config, name, rngs=rngs, layer_index=i)
        for i, name in enumerate(config.layer_mixers)])
    self.final_norm = modules.rms_norm(d, eps=config.norm_eps, rngs=rngs,
                                       dtype=config.dtype,
                                       param_dtype=config.param_dtype)
    self.lm_head = (None if config.tie_embeddings else modules.dense(
        d, config.vocab_size, ("embed", "vocab"), rngs=rngs,
        dtype=config.dtype, param_dtype=config.param_dtype))

  def init_cache(self, batch_size: int, max_len: int, dtype=None):
    """One cache per layer (a tuple) for up to ``max_len`` tokens per row."""
    dtype = self.config.dtype if dtype is None else dtype
    return tuple(block.mixer.init_cache(batch_size, max_len, dtype)
                 for block in self.blocks)

  def __call__(self, tokens, *, segment_ids=None, mode: str = "chunk",
               cache=None):
    """Logits ``[B, T, vocab]`` float32, or ``(logits, cache)`` with a cache.

    Args:
      tokens: ``[B, T]`` int token ids.
      segment_ids: ``[B, T]`` int, packed documents (no attention or state
        crosses a change of id).
      mode: ``"chunk"``, ``"parallel"`` or ``"recurrent"``: the form every
        mixer runs.
      cache: from ``init_cache`` or a previous call. Any ``T`` is a prefill
        from the cached state; ``T = 1`` decodes with the step forms.
    """
    check_mode(mode)
    checks.check_rank("tokens", tokens, 2, "[B, T]")
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
      raise ValueError(f"tokens must be integer ids, got "
                       f"{jnp.result_type(tokens)}")
    if cache is not None and len(cache) != len(self.blocks):
      raise ValueError(f"cache has {len(cache)} layers, the model "
                       f"{len(self.blocks)}; build it with LM.init_cache")
    x = sharding.constrain(self.embed(tokens), RESIDUAL_AXES)   # [B, T, D]
    new_cache = []
    remat = REMAT_POLICIES[self.config.remat]
    for i, block in enumerate(self.blocks):
      if cache is None and remat is not None:

        def run(block, x, segment_ids):
          return block(x, segment_ids=segment_ids, mode=mode, cache=None)[0]

        x = nnx.remat(run, policy=remat[0])(block, x, segment_ids)
        layer_cache = None
      else:
        x, layer_cache = block(x, segment_ids=segment_ids, mode=mode,
                               cache=None if cache is None else cache[i])
      x = sharding.constrain(x, RESIDUAL_AXES)
      new_cache.append(layer_cache)
    x = self.final_norm(x)
    if self.lm_head is None:
      logits = self.embed.attend(x)
    else:
      logits = self.lm_head(x)
    logits = logits.astype(jnp.float32)                         # [B, T, vocab]
    if cache is None:
      return logits
    return logits, tuple(new_cache)

  def generate(self, prompt, max_new_tokens: int, *, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None,
               rng=None):
    """Continues ``prompt: [B, P]`` by ``max_new_tokens`` sampled tokens.

    The prompt is prefilled with the chunk forms, then every new token is
    decoded with the step forms (``lax.scan``), in one program compiled once
    per shape and sampling setting. ``temperature=0`` is greedy; otherwise
    logits are divided by it, cut to the ``top_k`` largest and to the
    smallest set of probability at least ``top_p``, and sampled with
    ``rng`` (a PRNG key, required).

    Returns:
      ``[B, P + max_new_tokens]`` int32: the prompt and its continuation.
    """
    checks.check_rank("prompt", prompt, 2, "[B, P]")
    if not jnp.issubdtype(jnp.result_type(prompt), jnp.integer):
      raise ValueError(f"prompt must be integer ids, got "
                       f"{jnp.result_type(prompt)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be a positive int, got "
                       f"{max_new_tokens!r}")
    sampling = Sampling(float(temperature), top_k, top_p)
    if sampling.temperature > 0 and rng is None:
      raise ValueError("sampling with temperature > 0 needs rng (a PRNG key)")
    rng = jax.random.key(0) if rng is None else rng
    graphdef, state = nnx.split(self)
    return _generate(graphdef, state, jnp.asarray(prompt, jnp.int32), rng,
                     max_new_tokens=max_new_tokens, sampling=sampling)


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
    if self.top_k is not None and (not isinstance(self.top_k, int)
                                   or self.top_k < 1):
      raise ValueError(f"top_k must be a positive int, got {self.top_k!r}")
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


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens",
                                             "sampling"))
def _generate(graphdef, state, prompt, rng, *, max_new_tokens: int,
              sampling: Sampling):
  model = nnx.merge(graphdef, state)
  batch, length = prompt.shape
  cache = model.init_cache(batch, length + max_new_tokens)
  logits, cache = model(prompt, cache=cache, mode="chunk")
  keys = jax.random.split(rng, max_new_tokens)
  first = sampling(logits[:, -1], keys[0])

  def step(carry, key):
    token, cache = carry
    logits, cache = model(token[:, None], cache=cache)
    following = sampling(logits[:, -1], key)
    return (following, cache), following

  _, rest = jax.lax.scan(step, (first, cache), keys[1:])
  return jnp.concatenate([prompt, first[:, None], rest.T], axis=1)
