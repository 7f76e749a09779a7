"""The train state, its sharded creation, the train and eval steps.

``Trainer`` ties a model config, a ``TrainConfig``, a mesh and sharding
rules together::

    mesh = sharding.make_mesh("fsdp=-1")
    trainer = Trainer(LMConfig(...), TrainConfig(...), mesh=mesh,
                      rules="fsdp")
    state = trainer.init()                        # created sharded
    state, metrics = trainer.step(state, batch)   # jitted, state donated

- The state is created already sharded: the model is built abstractly
  (``nnx.eval_shape``), the parameters' logical axes give every array's
  sharding, and one jitted function with those output shardings draws the
  parameters and the optimizer state on their devices. No array is ever
  whole on one device unless its rules replicate it.
- ``step`` is a pure function of ``(state, batch)``: next-token
  cross-entropy (``loss.cross_entropy_sums``) summed over micro-batches
  (``grad_accum``), gradients divided by the batch's token count, then
  clipping and AdamW. The state argument is donated. With mixture-of-experts
  layers, ``router_aux_loss_coef`` times the load-balancing loss joins the
  objective (each micro-batch's loss weighted by its token count), and
  ``router_bias_rate`` moves the routers' selection biases after the
  update (``LM.balance_experts``, outside the gradient).
- Random draws are partitionable (``jax_threefry_partitionable``, JAX's
  default), so the same seed gives the same parameters on any mesh.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from lin_attn_jax import sharding as shd
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.models.encoder import (Classifier, ClassifierConfig,
                                         MaskedLM, MLMConfig, ViT, ViTConfig)
from lin_attn_jax.models.lm import LM, LMConfig
from lin_attn_jax.train import optim
from lin_attn_jax.train.config import TrainConfig
from lin_attn_jax.train.loss import cross_entropy_sums

BATCH_KEYS = ("inputs", "targets", "weights", "segment_ids")

# The model class of each config class (the exact type).
MODEL_CLASSES = {LMConfig: LM, MLMConfig: MaskedLM,
                 ClassifierConfig: Classifier, ViTConfig: ViT}


def model_class(model_config):
  """The model class that ``model_config`` (by its exact type) builds."""
  found = MODEL_CLASSES.get(type(model_config))
  if found is None:
    raise ValueError(f"no model for a {type(model_config).__name__}; known: "
                     f"{sorted(c.__name__ for c in MODEL_CLASSES)}")
  return found


def takes_segment_ids(model_config) -> bool:
  """Whether every mixer of ``model_config`` takes ``segment_ids``
  (``Mixer.segments``; Linformer does not)."""
  return all(MIXERS[name].segments for name in model_config.layer_mixers
             if name in MIXERS)


def batch_shapes(model_config, batch_size: int, seq_len: int) -> dict:
  """``{key: shape}`` of the batch a step of ``model_config``'s model
  reads: ``[B, T]`` arrays for the LM and the masked LM (``BATCH_KEYS``);
  ``inputs`` and ``segment_ids`` ``[B, T]``, ``targets`` (labels) and
  ``weights`` ``[B]`` for a classifier; ``inputs [B, H, W, C]`` images and
  ``[B]`` labels and weights for a ViT (``seq_len`` unused). An encoder
  with a mixer that takes no ``segment_ids`` (``takes_segment_ids``) reads
  none: a row is one example, its padding read as tokens."""
  b, t = batch_size, seq_len
  if isinstance(model_config, ViTConfig):
    side = model_config.image_size
    return {"inputs": (b, side, side, model_config.channels),
            "targets": (b,), "weights": (b,)}
  if isinstance(model_config, ClassifierConfig):
    shapes = {"inputs": (b, t), "segment_ids": (b, t), "targets": (b,),
              "weights": (b,)}
  else:
    shapes = {key: (b, t) for key in BATCH_KEYS}
  if (isinstance(model_config, (ClassifierConfig, MLMConfig))
      and not takes_segment_ids(model_config)):
    del shapes["segment_ids"]
  return shapes


def _batch_sharding(mesh, ndim: int):
  """Rows over the batch axes; the length (for ``ndim >= 2``) as
  ``sharding.batch_sharding`` places it."""
  if ndim == 1:
    return jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(shd.BATCH_AXES))
  return shd.batch_sharding(mesh, ndim)


@struct.dataclass
class TrainState:
  """Everything a training step changes."""

  # Optimizer steps taken, int32 scalar.
  step: jax.Array
  # The model's nnx.Param state.
  params: nnx.State
  # The optax state (moments per parameter, counters).
  opt_state: Any
  # The model's other variables (e.g. Performer's random projections).
  rest: nnx.State


def _key_path(path) -> str:
  return jax.tree_util.keystr(tuple(path))


def _optimizer_shardings(abstract_opt, params_shardings, mesh):
  """Optimizer-state leaves take the sharding of the parameter whose path
  ends theirs (Adam's moments mirror the parameters); the rest (counts) are
  replicated."""
  by_path = {_key_path(p): s for p, s in
             jax.tree_util.tree_flatten_with_path(params_shardings)[0]}
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def place(path, leaf):
    for i in range(len(path)):
      found = by_path.get(_key_path(path[i:]))
      if found is not None and len(found.spec) <= np.ndim(leaf):
        return found
    return replicated

  return jax.tree_util.tree_map_with_path(place, abstract_opt)


class Trainer:
  """Builds, steps, evaluates and checkpoints one model on one mesh.

  Args:
    model_config: an ``LMConfig``, or a config of ``models.encoder``
      (``MODEL_CLASSES``: classifier, masked LM, ViT), whose batches
      ``batch_shapes`` gives; every model is trained on the cross-entropy
      of its logits at ``targets``, weighted by ``weights``.
    train_config: the ``TrainConfig``.
    mesh: a mesh from ``sharding.make_mesh`` (default: every device on
      ``fsdp``).
    rules: a ``sharding.PRESETS`` name or a ``sharding.Rules``.
    compiler_options: XLA options for compiling the init, train and eval
      steps (``jax.jit(..., compiler_options=...)``), e.g.
      ``{"xla_backend_optimization_level": 0}`` to compile faster.

  Raises:
    ValueError: a batch that does not divide over ``data`` x ``fsdp`` (or
      into ``grad_accum`` micro-batches that do), or model widths that the
      rules cannot split over the mesh.
  """

  def __init__(self, model_config: LMConfig, train_config: TrainConfig, *,
               mesh: jax.sharding.Mesh | None = None,
               rules: str | shd.Rules = "fsdp",
               compiler_options: dict | None = None):
    self.model_config, self.config = model_config, train_config
    self.compiler_options = compiler_options
    self.mesh = shd.make_mesh() if mesh is None else mesh
    self.rules = shd.get_rules(rules)
    parts = shd.batch_divisor(self.mesh)
    micro = train_config.batch_size // train_config.grad_accum
    if train_config.batch_size % parts or micro % parts:
      raise ValueError(
          f"batch_size {train_config.batch_size} (in {train_config.grad_accum}"
          f" micro-batches of {micro}) is not divisible by data x fsdp x "
          "expert = "
          f"{parts} (mesh {shd.describe(self.mesh)})")
    seq = dict(zip(self.mesh.axis_names, self.mesh.axis_sizes))[
        shd.SEQUENCE_AXIS]
    if train_config.seq_len % seq:
      raise ValueError(f"seq_len {train_config.seq_len} is not divisible by "
                       f"the sequence mesh axis ({seq})")
    shd.check_model_fits(model_config, self.mesh, self.rules)

    seed = train_config.seed
    self.model_class = model_class(model_config)
    self.batch_shapes = batch_shapes(model_config, train_config.batch_size,
                                     train_config.seq_len)
    abstract_model = nnx.eval_shape(
        lambda: self.model_class(model_config, rngs=nnx.Rngs(seed)))
    self.graphdef, abstract_params, abstract_rest = nnx.split(
        abstract_model, nnx.Param, ...)
    self.decay_mask = optim.weight_decay_mask(abstract_model, abstract_params)
    self.tx = optim.make_optimizer(train_config, self.decay_mask)
    self.schedule = optim.learning_rate_schedule(train_config)

    def init():
      model = self.model_class(model_config, rngs=nnx.Rngs(seed))
      _, params, rest = nnx.split(model, nnx.Param, ...)
      return TrainState(jnp.zeros((), jnp.int32), params,
                        self.tx.init(params), rest)

    self._init_fn = init
    abstract = jax.eval_shape(init)
    params_shardings = shd.state_shardings(abstract_params, self.mesh,
                                           self.rules)
    replicated = jax.sharding.NamedSharding(self.mesh,
                                            jax.sharding.PartitionSpec())
    self.state_shardings = TrainState(
        step=replicated, params=params_shardings,
        opt_state=_optimizer_shardings(abstract.opt_state, params_shardings,
                                       self.mesh),
        rest=shd.state_shardings(abstract_rest, self.mesh, self.rules))
    self.abstract_state = jax.tree.map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                             sharding=s),
        abstract, self.state_shardings)
    self.batch_shardings = {key: _batch_sharding(self.mesh, len(shape))
                            for key, shape in self.batch_shapes.items()}
    self._step = jax.jit(self._train_step,
                         in_shardings=(self.state_shardings,
                                       self.batch_shardings),
                         out_shardings=(self.state_shardings, None),
                         donate_argnums=0, compiler_options=compiler_options)
    self._eval = jax.jit(self._eval_step,
                         in_shardings=(self.state_shardings,
                                       self.batch_shardings),
                         compiler_options=compiler_options)

  def init(self) -> TrainState:
    """A fresh state, created sharded on the mesh."""
    with jax.set_mesh(self.mesh), shd.use_rules(self.rules):
      return jax.jit(self._init_fn, out_shardings=self.state_shardings,
                     compiler_options=self.compiler_options)()

  def model(self, state: TrainState):
    """The model (an ``LM`` or ``model_class``'s) holding ``state``'s parameters (for evaluation and
    generation; call it under ``jax.set_mesh(trainer.mesh)``)."""
    return nnx.merge(self.graphdef, state.params, state.rest)

  def _loss_sums(self, params, rest, batch):
    """``(loss_sum, count, z_sum, aux, correct)`` of a batch (``aux``: the
    model's; ``correct``: counted targets that are the logits' argmax)."""
    model = nnx.merge(self.graphdef, params, rest)
    logits, aux = model(batch["inputs"], segment_ids=batch.get("segment_ids"),
                        return_aux=True)
    hits = jnp.argmax(logits, axis=-1) == batch["targets"]
    correct = jnp.sum(jnp.where(hits, batch["weights"], 0.0))
    return cross_entropy_sums(logits, batch["targets"], batch["weights"],
                              self.config.z_loss) + (aux, correct)

  def _train_step(self, state: TrainState, batch: dict):
    with shd.use_rules(self.rules):
      accum = self.config.grad_accum
      batch = {key: batch[key] for key in self.batch_shapes}

      coef = self.config.router_aux_loss_coef

      def grads_of(micro):
        def objective(params):
          loss_sum, count, z_sum, aux, _ = self._loss_sums(
              params, state.rest, micro)
          balance = aux["load_balancing_loss"]
          return (loss_sum + coef * balance * count,
                  (loss_sum, count, z_sum, aux))

        (_, (loss_sum, count, z_sum, aux)), grads = jax.value_and_grad(
            objective, has_aux=True)(state.params)
        return grads, loss_sum, count, z_sum, aux

      if accum == 1:
        grads, loss_sum, count, z_sum, aux = grads_of(batch)
        balance_sum = aux["load_balancing_loss"] * count
        load = aux["expert_load"]
      else:
        # Micro-batch a takes rows a, a + accum, ...: every device holds
        # its share of every micro-batch.
        def split(x):
          b = x.shape[0]
          x = x.reshape((b // accum, accum) + x.shape[1:])
          x = jnp.swapaxes(x, 0, 1)                  # [accum, B / accum, ...]
          axes = (None, "batch", "length") + (None,) * (x.ndim - 3)
          return shd.constrain(x, axes[:x.ndim])

        micros = jax.tree.map(split, batch)
        zeros = jax.tree.map(jnp.zeros_like, state.params)

        def body(carry, micro):
          grads, loss_sum, count, z_sum, aux = grads_of(micro)
          acc = jax.tree.map(jnp.add, carry[0], grads)
          return (acc, carry[1] + loss_sum, carry[2] + count,
                  carry[3] + z_sum,
                  carry[4] + aux["load_balancing_loss"] * count,
                  carry[5] + aux["expert_load"]), None

        scalar = jnp.zeros((), jnp.float32)
        layers = self.model_config.layer_mlps.count("moe")
        init = (zeros, scalar, scalar, scalar, scalar,
                jnp.zeros((layers, self.model_config.n_experts or 0),
                          jnp.float32))
        (grads, loss_sum, count, z_sum, balance_sum, load), _ = jax.lax.scan(
            body, init, micros)
      denominator = jnp.maximum(count, 1.0)
      grads = jax.tree.map(lambda g: g / denominator, grads)
      grad_norm = optax.tree.norm(grads)
      updates, opt_state = self.tx.update(grads, state.opt_state,
                                          state.params)
      params = optax.apply_updates(state.params, updates)
      metrics = {
          "loss": (loss_sum - z_sum) / denominator,
          "z_loss": z_sum / denominator,
          "grad_norm": grad_norm,
          "learning_rate": self.schedule(state.step),
          "tokens": count,
      }
      rest = state.rest
      if self.model_config.n_experts is not None:
        metrics["router_aux_loss"] = balance_sum / denominator
        if self.config.router_bias_rate > 0:
          model = nnx.merge(self.graphdef, state.params, state.rest)
          model.balance_experts(load, self.config.router_bias_rate)
          rest = nnx.state(model, nnx.Not(nnx.Param))
      new_state = state.replace(step=state.step + 1, params=params,
                                opt_state=opt_state, rest=rest)
      return new_state, metrics

  def _eval_step(self, state: TrainState, batch: dict):
    with shd.use_rules(self.rules):
      loss_sum, count, z_sum, _, correct = self._loss_sums(
          state.params, state.rest, batch)
      return {"loss_sum": loss_sum - z_sum, "tokens": count,
              "correct": correct}

  def step(self, state: TrainState, batch: dict):
    """One optimizer step; ``state`` is donated (do not use it again).

    ``batch`` holds the arrays of ``batch_shapes`` (for an LM ``[B, T]``
    ``inputs``, ``targets``, ``weights`` and ``segment_ids``,
    ``data.model_inputs``), global arrays or host arrays (placed here).
    Returns ``(new state, metrics)``.
    """
    with jax.set_mesh(self.mesh):
      return self._step(state, self.place_batch(batch))

  def eval_sums(self, state: TrainState, batch: dict) -> dict:
    """``{"loss_sum", "tokens", "correct"}`` of a batch, no update
    (``correct``: counted targets that are the argmax of the logits)."""
    with jax.set_mesh(self.mesh):
      return self._eval(state, self.place_batch(batch))

  def place_batch(self, batch: dict) -> dict:
    """``batch`` (host or global arrays) sharded as the step expects."""
    missing = sorted(set(self.batch_shapes) - set(batch))
    if missing:
      raise ValueError(f"batch lacks {missing}; it needs "
                       f"{tuple(self.batch_shapes)} (see data.model_inputs, "
                       "data.tasks)")
    out = {}
    for key, want in self.batch_shapes.items():
      value = batch[key]
      if tuple(np.shape(value)) != want:
        raise ValueError(f"batch[{key!r}] must have shape {want} "
                         f"(Trainer.batch_shapes), got {np.shape(value)}")
      if isinstance(value, jax.Array) and value.sharding == \
          self.batch_shardings[key]:
        out[key] = value
      else:
        out[key] = jax.device_put(value, self.batch_shardings[key])
    return out

  def restore(self, checkpointer, check: bool = True):
    """``(state, data, step)`` from the newest readable checkpoint of
    ``checkpointer`` (restored onto this trainer's mesh), or None."""
    return checkpointer.restore_latest(
        self.abstract_state,
        check_config=self.check_stored_config if check else None)

  def config_record(self) -> dict:
    return {"model": self.model_config.to_dict(),
            "train": self.config.to_dict(),
            "rules": self.rules.name}

  def check_stored_config(self, stored: dict) -> None:
    """Raises ``ValueError`` when a checkpoint's model differs from this
    one's (training settings may change between runs; the model may not)."""
    mine = self.model_config.to_dict()
    theirs = dict(stored.get("model", {}))
    # Fields added since the checkpoint was written hold their defaults.
    defaults = type(self.model_config)().to_dict()
    theirs.update({k: defaults[k] for k in set(defaults) - set(theirs)})
    differ = sorted(k for k in set(mine) | set(theirs)
                    if mine.get(k) != theirs.get(k)
                    and k not in ("dtype", "remat"))
    if differ:
      shown = ", ".join(f"{k}: checkpoint {theirs.get(k)!r} vs "
                        f"{mine.get(k)!r}" for k in differ)
      raise ValueError(f"the checkpoint holds another model ({shown})")
