"""AdamW with warmup + cosine decay, global-norm clipping and a weight-decay
mask.

Weight decay applies to weight matrices (every parameter with two or more
dimensions, the embedding included) and to nothing else: not to norm
scales and biases (one dimension), and not to the decay and gate parameters
a mixer lists in its ``no_weight_decay`` (``A_log``, ``dt_bias``, decay
bases, RWKV's token-shift mixes and bonus, H3's SSM parameters, ...):
shrinking those towards zero would change the memory of the recurrence,
not regularise a projection.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from lin_attn_jax.layers.base import Mixer
from lin_attn_jax.train.config import TrainConfig


def learning_rate_schedule(config: TrainConfig) -> optax.Schedule:
  """Linear warmup to ``learning_rate``, then cosine decay to
  ``learning_rate * min_lr_ratio`` at ``steps``."""
  peak = config.learning_rate
  warmup = min(config.warmup_steps, config.steps)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup else peak, peak_value=peak,
      warmup_steps=warmup, decay_steps=max(config.steps, warmup + 1),
      end_value=peak * config.min_lr_ratio)


def no_decay_paths(model: nnx.Module) -> set[tuple]:
  """Paths of the parameters the model's mixers exclude from weight decay."""
  paths = set()
  for path, node in nnx.iter_graph(model):
    if isinstance(node, Mixer):
      for name in type(node).no_weight_decay:
        paths.add(tuple(path) + tuple(name.split(".")))
  return paths


def weight_decay_mask(model: nnx.Module, params: nnx.State | None = None):
  """A tree like ``params`` (default: the model's ``nnx.Param`` state) of
  bools, True where weight decay applies."""
  params = nnx.state(model, nnx.Param) if params is None else params
  excluded = no_decay_paths(model)

  def decays(path, leaf):
    keys = tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
                 for k in path)
    keys = tuple(k for k in keys if k != "value")
    return jnp.ndim(leaf) >= 2 and keys not in excluded

  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(config: TrainConfig, mask) -> optax.GradientTransformation:
  """Clipping (when ``clip_norm > 0``) then AdamW with the schedule and
  ``mask`` (from ``weight_decay_mask``)."""
  parts = []
  if config.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(config.clip_norm))
  parts.append(optax.adamw(learning_rate_schedule(config), b1=config.b1,
                           b2=config.b2, eps=config.eps,
                           weight_decay=config.weight_decay, mask=mask))
  return optax.chain(*parts)
