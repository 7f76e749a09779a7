"""Bidirectional encoders: a sequence classifier, a masked LM and a ViT.

``Encoder`` is the ``LM``'s stack of pre-norm blocks (``lm.Block``) and
final norm with every mixer built with ``causal=False`` (``docs/layers.md``,
"Non-causal mixers"): each token reads its whole document, both ways, and
``segment_ids`` keep documents (and padding, id 0) apart in both directions.
A mixer whose class has no non-causal form is a ``ValueError`` naming it;
Linformer, non-causal by construction, is taken as it is. Short
convolutions and RWKV's channel mixing stay causal (local mixing of the last
few tokens). Positions are learned (a ``[max_len, D]`` table added to the
embeddings) or none (the mixers' own, e.g. rotary embeddings).

On top of it:

- ``Classifier``: logits ``[B, C]`` from the mean of the final states over
  the tokens whose segment id is not 0 (``pooling="mean"``) or from a
  learned class token put before the sequence (``pooling="cls"``);
- ``MaskedLM``: logits ``[B, T, V]`` over the vocabulary, with one more
  embedding row, ``mask_id = vocab_size``, for the ``[MASK]`` token
  (BERT's objective; the masking is ``data.mlm.mask_tokens``);
- ``ViT``: an image ``[B, H, W, C]`` cut into ``P x P`` patches, each
  flattened and projected to ``D`` (Dosovitskiy et al. 2021,
  https://arxiv.org/abs/2010.11929), with 2-D positions, learned (one
  vector per patch of the grid) or fixed 2-D sin-cos (MAE's: half the
  width codes the row, half the column), through the ``Encoder``, then
  class-token or mean pooling and a linear head.

Configs extend ``LMConfig`` (the blocks' fields keep their meaning), so
``to_dict``/``from_dict``, sharding checks and the ``Trainer`` take them.

Example:
  >>> config = ClassifierConfig(vocab_size=16, d_model=32, n_layers=2,
  ...                           n_heads=2, mixer="gla", num_classes=10)
  >>> model = Classifier(config, rngs=nnx.Rngs(0))
  >>> model(jnp.ones((2, 12), jnp.int32)).shape
  (2, 10)
"""

from __future__ import annotations

import dataclasses
import inspect

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax import sharding
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.layers import modules
from lin_attn_jax.models.lm import (REMAT_POLICIES, RESIDUAL_AXES, Block,
                                    LMConfig, _aux_outputs, make_norm)
from lin_attn_jax.ops.common import checks

POOLINGS = ("mean", "cls")


def non_causal_options(name: str) -> dict:
  """The constructor options that make mixer ``name`` non-causal: ``{}``
  for a mixer that is non-causal already (Linformer), ``{"causal":
  False}`` for one with a non-causal form; ``ValueError`` otherwise."""
  cls = MIXERS[name]
  if not cls.causal:
    return {}
  if "causal" in inspect.signature(cls.__init__).parameters:
    return {"causal": False}
  raise ValueError(f"mixer {name!r} has no non-causal form, so it cannot be "
                   "an encoder's; see docs/layers.md, 'Non-causal mixers'")


@dataclasses.dataclass(frozen=True)
class EncoderConfig(LMConfig):
  """An ``LMConfig`` whose blocks are bidirectional; see the module
  docstring. ``tie_embeddings``, ``logits_soft_cap`` and the ``"logits"``
  multiplier matter only to ``MaskedLM``."""

  # "learned": a [max_len, D] table added to the token embeddings; "none":
  # only the mixers' own positions.
  positions: str = "learned"
  # Longest sequence with learned positions.
  max_len: int = 512

  position_kinds = ("learned", "none")

  def __post_init__(self):
    super().__post_init__()
    if self.positions not in self.position_kinds:
      raise ValueError(f"positions must be one of {self.position_kinds}, "
                       f"got {self.positions!r}")
    checks.positive_int("max_len", self.max_len)
    for name in dict.fromkeys(self.layer_mixers):
      if name != "none":
        non_causal_options(name)

  def options_for(self, name: str) -> dict:
    return {**super().options_for(name), **non_causal_options(name)}


@dataclasses.dataclass(frozen=True)
class ClassifierConfig(EncoderConfig):
  """An ``EncoderConfig`` with a classification head."""

  # Number of classes C; logits are [B, C].
  num_classes: int = 2
  # "mean": mean of the final states over non-padding tokens; "cls": the
  # final state of a learned class token put before the sequence.
  pooling: str = "mean"

  def __post_init__(self):
    super().__post_init__()
    checks.positive_int("num_classes", self.num_classes)
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling must be one of {POOLINGS}, got "
                       f"{self.pooling!r}")


@dataclasses.dataclass(frozen=True)
class MLMConfig(EncoderConfig):
  """An ``EncoderConfig`` with a masked-LM head (``MaskedLM``): token ids
  ``< vocab_size`` and ``mask_id = vocab_size``."""


@dataclasses.dataclass(frozen=True)
class ViTConfig(ClassifierConfig):
  """A ``ClassifierConfig`` over images; ``vocab_size`` and ``max_len`` are
  unused. ``positions`` is "learned" (a vector per patch), "sincos2d"
  (fixed, needs ``d_model % 4 == 0``) or "none"."""

  # Square images of image_size x image_size pixels with `channels` values.
  image_size: int = 32
  channels: int = 1
  # Square patches of patch_size x patch_size pixels (divides image_size).
  patch_size: int = 4
  positions: str = "sincos2d"
  pooling: str = "cls"

  position_kinds = ("learned", "sincos2d", "none")

  def __post_init__(self):
    super().__post_init__()
    for name in ("image_size", "channels", "patch_size"):
      checks.positive_int(name, getattr(self, name))
    if self.image_size % self.patch_size:
      raise ValueError(f"patch_size {self.patch_size} does not divide "
                       f"image_size {self.image_size}")
    if self.positions == "sincos2d" and self.d_model % 4:
      raise ValueError(f"positions 'sincos2d' needs d_model % 4 == 0, got "
                       f"d_model = {self.d_model}")

  @property
  def grid(self) -> int:
    """Patches per side; the sequence has ``grid ** 2`` patches."""
    return self.image_size // self.patch_size


class Encoder(nnx.Module):
  """Token embedding (with ``tokens=True``), learned positions, the blocks
  and the final norm; see the module docstring.

  Args:
    config: an ``EncoderConfig``.
    tokens: build the token embedding and positions (False for inputs that
      are embedded elsewhere, as ``ViT``'s patches).
    extra_tokens: embedding rows after the vocabulary (``MaskedLM``'s mask
      token).
  """

  def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs,
               tokens: bool = True, extra_tokens: int = 0):
    self.config = config
    d = config.d_model
    self.embed = (nnx.Embed(
        config.vocab_size + extra_tokens, d, dtype=config.dtype,
        param_dtype=config.param_dtype,
        embedding_init=modules.partitioned(
            nnx.initializers.normal(stddev=d ** -0.5), ("vocab", "embed")),
        rngs=rngs) if tokens else None)
    self.position_embed = (modules.param(
        rngs, nnx.initializers.normal(stddev=0.02), (config.max_len, d),
        (None, "embed"), config.param_dtype)
        if tokens and config.positions == "learned" else None)
    self.embed_norm = (make_norm(config, rngs=rngs) if config.embed_norm
                       else None)
    self.blocks = nnx.List([
        Block(config, name, rngs=rngs, layer_index=i)
        for i, name in enumerate(config.layer_mixers)])
    self.final_norm = make_norm(config, rngs=rngs)

  def embed_tokens(self, tokens, positions=None):
    """``tokens [B, T]`` int -> ``[B, T, D]`` embeddings (plus the learned
    positions: ``positions [B, T]`` int, default ``0 .. T - 1``)."""
    checks.check_rank("tokens", tokens, 2, "[B, T]")
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
      raise ValueError(f"tokens must be integer ids, got "
                       f"{jnp.result_type(tokens)}")
    x = self.embed(tokens)                                      # [B, T, D]
    if self.config.embed_scale is not None:
      x = x * jnp.asarray(self.config.embed_scale, x.dtype)
    if self.position_embed is not None:
      length = tokens.shape[1]
      if positions is None:
        if length > self.config.max_len:
          raise ValueError(f"tokens have T = {length} > max_len = "
                           f"{self.config.max_len} learned positions")
        positions = jnp.arange(length)[None]                    # [1, T]
      table = self.position_embed[...].astype(x.dtype)          # [L, D]
      x = x + jnp.take(table, positions, axis=0)                # [B, T, D]
    return x

  def encode(self, x, *, segment_ids=None, return_aux: bool = False):
    """``x [B, T, D]`` embeddings -> final states ``[B, T, D]`` (normed),
    with ``aux`` (``LM``'s) when ``return_aux``."""
    checks.check_rank("x", x, 3, "[B, T, D]")
    if self.embed_norm is not None:
      x = self.embed_norm(x)
    x = sharding.constrain(x, RESIDUAL_AXES)
    carry = {}
    remat = REMAT_POLICIES[self.config.remat]
    for block in self.blocks:

      def run(block, x, segment_ids, carry):
        x, _, carry = block(x, segment_ids=segment_ids, mode="chunk",
                            cache=None, carry=carry)
        return x, carry

      if remat is not None:
        run = nnx.remat(run, policy=remat[0])
      x, carry = run(block, x, segment_ids, carry)
      x = sharding.constrain(x, RESIDUAL_AXES)
    x = self.final_norm(x)
    if return_aux:
      return x, _aux_outputs(carry.get("router_stats", ()))
    return x

  def __call__(self, tokens, *, segment_ids=None, positions=None,
               return_aux: bool = False):
    """``tokens [B, T]`` -> final states ``[B, T, D]`` (see ``encode``)."""
    return self.encode(self.embed_tokens(tokens, positions),
                       segment_ids=segment_ids, return_aux=return_aux)


def _pooled(encoder: Encoder, x, segment_ids, cls_token, return_aux):
  """Final states pooled to ``[B, D]`` float32: the class token's (put
  before ``x [B, T, D]``, in the row's document: the largest segment id of
  the row) or the mean over the tokens whose segment id is not 0."""
  batch = x.shape[0]
  if cls_token is not None:
    token = jnp.broadcast_to(cls_token[...].astype(x.dtype),
                             (batch, 1, x.shape[-1]))           # [B, 1, D]
    x = jnp.concatenate([token, x], axis=1)                     # [B, 1+T, D]
    if segment_ids is not None:
      own = jnp.max(segment_ids, axis=1, keepdims=True)         # [B, 1]
      segment_ids = jnp.concatenate([own, segment_ids], axis=1)
  h, aux = encoder.encode(x, segment_ids=segment_ids, return_aux=True)
  if cls_token is not None:
    return h[:, 0].astype(jnp.float32), aux
  h = h.astype(jnp.float32)
  if segment_ids is None:
    return jnp.mean(h, axis=1), aux
  keep = (segment_ids != 0).astype(jnp.float32)[..., None]      # [B, T, 1]
  count = jnp.maximum(jnp.sum(keep, axis=1), 1.0)               # [B, 1]
  return jnp.sum(h * keep, axis=1) / count, aux


def _class_token(config, rngs):
  if config.pooling != "cls":
    return None
  return modules.param(rngs, nnx.initializers.normal(stddev=0.02),
                       (config.d_model,), ("embed",), config.param_dtype)


def _head(config, rngs):
  return modules.dense(config.d_model, config.num_classes, ("embed", None),
                       rngs=rngs, use_bias=True, dtype=jnp.float32,
                       param_dtype=config.param_dtype)


def _outputs(logits, aux, return_aux):
  return (logits, aux) if return_aux else logits


class Classifier(nnx.Module):
  """Sequence classifier: ``Encoder``, pooling, a linear head.

  ``__call__(tokens [B, T], segment_ids=None, positions=None,
  return_aux=False)`` -> logits ``[B, C]`` float32 (and ``aux``). A row
  holds one example: its tokens (segment id > 0) and padding (segment id
  0), which the pooled output does not depend on.
  """

  def __init__(self, config: ClassifierConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.encoder = Encoder(config, rngs=rngs)
    self.cls_token = _class_token(config, rngs)
    self.head = _head(config, rngs)

  def __call__(self, tokens, *, segment_ids=None, positions=None,
               return_aux: bool = False):
    x = self.encoder.embed_tokens(tokens, positions)            # [B, T, D]
    pooled, aux = _pooled(self.encoder, x, segment_ids, self.cls_token, True)
    return _outputs(self.head(pooled), aux, return_aux)         # [B, C]


class MaskedLM(nnx.Module):
  """Masked language model: ``Encoder`` (vocabulary plus ``mask_id``) and
  tied or untied output embeddings over the ``vocab_size`` ids.

  ``__call__(tokens [B, T], segment_ids=None, positions=None,
  return_aux=False)`` -> logits ``[B, T, vocab_size]`` float32.
  """

  def __init__(self, config: MLMConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.mask_id = config.vocab_size
    self.encoder = Encoder(config, rngs=rngs, extra_tokens=1)
    self.lm_head = (None if config.tie_embeddings else modules.dense(
        config.d_model, config.vocab_size, ("embed", "vocab"), rngs=rngs,
        dtype=config.dtype, param_dtype=config.param_dtype))

  def __call__(self, tokens, *, segment_ids=None, positions=None,
               return_aux: bool = False):
    h, aux = self.encoder(tokens, segment_ids=segment_ids,
                          positions=positions, return_aux=True)
    if self.lm_head is None:
      table = self.encoder.embed.embedding[...][:self.config.vocab_size]
      logits = jnp.einsum("btd,vd->btv", h,
                          table.astype(h.dtype))                # [B, T, V]
    else:
      logits = self.lm_head(h)
    logits = logits.astype(jnp.float32)
    if self.config.multiplier("logits") != 1.0:
      logits = logits * self.config.multiplier("logits")
    if self.config.logits_soft_cap is not None:
      cap = self.config.logits_soft_cap
      logits = cap * jnp.tanh(logits / cap)
    return _outputs(logits, aux, return_aux)


def sincos_2d(grid: int, dim: int) -> np.ndarray:
  """Fixed 2-D positions ``[grid * grid, dim]`` float32, row-major patches:
  the first ``dim / 2`` values code the row, the rest the column, each as
  ``sin(p w), cos(p w)`` with ``w_i = 10000 ** (-i / (dim / 4))`` (MAE's
  ``get_2d_sincos_pos_embed``)."""
  quarter = dim // 4
  omega = 1.0 / 10000.0 ** (np.arange(quarter, dtype=np.float64) / quarter)
  rows, cols = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")

  def code(p):
    angle = p.reshape(-1)[:, None] * omega[None]                # [N, D/4]
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)

  return np.concatenate([code(rows), code(cols)], axis=1).astype(np.float32)


class ViT(nnx.Module):
  """Vision Transformer over any non-causal mixer; see the module
  docstring.

  ``__call__(images [B, H, W, C], segment_ids=None, return_aux=False)``
  -> logits ``[B, num_classes]`` float32. ``images`` may be integer pixels
  (divided by 255) or floats; ``segment_ids`` is accepted for the
  trainer's sake and must be None.
  """

  def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs):
    self.config = config
    p, c, d = config.patch_size, config.channels, config.d_model
    self.patch_embed = modules.dense(
        p * p * c, d, (None, "embed"), rngs=rngs, use_bias=True,
        dtype=config.dtype, param_dtype=config.param_dtype)
    self.position_embed = (modules.param(
        rngs, nnx.initializers.normal(stddev=0.02), (config.grid ** 2, d),
        (None, "embed"), config.param_dtype)
        if config.positions == "learned" else None)
    self.encoder = Encoder(config, rngs=rngs, tokens=False)
    self.cls_token = _class_token(config, rngs)
    self.head = _head(config, rngs)

  def patches(self, images):
    """``images [B, H, W, C]`` -> ``[B, N, P * P * C]``, patches row-major,
    each flattened as ``(row, column, channel)``."""
    cfg = self.config
    checks.check_rank("images", images, 4, "[B, H, W, C]")
    want = (cfg.image_size, cfg.image_size, cfg.channels)
    if checks.shape_of(images)[1:] != want:
      raise ValueError(f"images must have shape [B, H, W, C] with (H, W, C) "
                       f"= {want}, got {checks.shape_of(images)}")
    if jnp.issubdtype(jnp.result_type(images), jnp.integer):
      images = images.astype(jnp.float32) / 255.0
    b, g, p = images.shape[0], cfg.grid, cfg.patch_size
    x = images.reshape(b, g, p, g, p, cfg.channels)             # [B, g, P, g, P, C]
    x = x.transpose(0, 1, 3, 2, 4, 5)                           # [B, g, g, P, P, C]
    return x.reshape(b, g * g, p * p * cfg.channels).astype(cfg.dtype)

  def __call__(self, images, *, segment_ids=None, return_aux: bool = False):
    if segment_ids is not None:
      raise ValueError("ViT takes no segment_ids: an image is one document")
    x = self.patch_embed(self.patches(images))                  # [B, N, D]
    if self.position_embed is not None:
      x = x + self.position_embed[...].astype(x.dtype)[None]
    elif self.config.positions == "sincos2d":
      x = x + jnp.asarray(sincos_2d(self.config.grid, self.config.d_model),
                          x.dtype)[None]
    pooled, aux = _pooled(self.encoder, x, None, self.cls_token, True)
    return _outputs(self.head(pooled), aux, return_aux)         # [B, C]
