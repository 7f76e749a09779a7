"""A mixture-of-experts SwiGLU MLP: top-k routing, grouped expert matmuls,
shared experts, the load-balancing statistics and expert parallelism.

For a token ``x [D]`` with router logits ``z = x W_r [E]`` (float32):

1. scores ``s = softmax(z)`` or ``sigmoid(z)`` (``score``);
2. the ``top_k`` experts by ``s + b`` (``b``, the selection bias, zero
   unless ``selection_bias``), among the ``topk_groups`` best of ``n_groups``
   equal groups of experts when ``n_groups > 1`` (a group ranks by the sum
   of its two best ``s + b``);
3. weights ``w_i = s_i`` of the chosen experts (the bias never enters
   them), divided by ``sum_i w_i + 1e-20`` when ``normalize_topk``, times
   ``routed_scale``;
4. ``y = sum_i w_i E_i(x) + shared(x)``, every expert
   ``E_i(x) = down_i(silu(gate_i x) * up_i x)``, the shared expert the same
   SwiGLU of width ``shared_dim`` (none when 0), times ``sigmoid(x w_g)``
   when ``shared_gate``. With ``activation="relu2"`` the experts, shared
   one included, have no gate: ``E_i(x) = down_i(relu(up_i x)^2)``
   (Nemotron-H's).

The published routers, as these options (transformers' ``modeling_*``):

| model | options |
|---|---|
| Qwen3-Next (``qwen3_next``) | ``score="softmax"``, ``normalize_topk=norm_topk_prob``, ``shared_dim=shared_expert_intermediate_size``, ``shared_gate=True`` |
| Kimi Linear, DeepSeek-V3 | ``score="sigmoid"``, ``selection_bias=True`` (``e_score_correction_bias``), ``n_groups=n_group``, ``topk_groups=topk_group``, ``normalize_topk=norm_topk_prob``, ``routed_scale=routed_scaling_factor``, ``shared_dim=moe_intermediate_size * n_shared_experts`` |
| Granite 4.0-H (``granitemoehybrid``) | ``score="softmax"``, ``normalize_topk=True`` (its softmax over the top-k logits is the same), ``shared_dim=shared_intermediate_size`` |
| Jamba | ``score="softmax"``, ``normalize_topk=False`` |
| MiniMax | ``score="softmax"``, ``normalize_topk=True`` (its training-time ``router_jitter_noise`` is not implemented) |
| Nemotron-H (``nemotron_h``) | ``activation="relu2"``, ``score="sigmoid"``, ``selection_bias=True``, ``n_groups=n_group``, ``topk_groups=topk_group``, ``normalize_topk=norm_topk_prob``, ``routed_scale=routed_scaling_factor``, ``shared_dim=moe_shared_expert_intermediate_size`` |

Parameters (``nnx.Param`` unless said) and how transformers 5 holds them
(``W_hf`` a ``torch.nn.Linear`` weight, ``[out, in]``):

- ``router [D, E]``: ``gate.weight.T`` (Granite: ``router.weight.T``, on
  disk ``router.layer.weight``; Jamba: ``router.weight.T``);
- ``gate, up [E, D, F]`` and ``down [E, F, D]``: transformers fuses
  ``experts.gate_up_proj [E, 2F, D]`` (gate the first ``F`` rows) and
  ``experts.down_proj [E, D, F]``, so ``gate = gate_up_proj[:, :F].mT``,
  ``up = gate_up_proj[:, F:].mT``, ``down = down_proj.mT``. On disk the
  Qwen3-Next and DeepSeek-V3 checkpoints keep one tensor per expert,
  ``experts.{e}.{gate,up,down}_proj.weight``; Kimi Linear and MiniMax
  ``block_sparse_moe.experts.{e}.w1`` (gate), ``w3`` (up), ``w2`` (down);
  Granite ``block_sparse_moe.input_linear.weight [E, 2F, D]`` and
  ``output_linear.weight [E, D, F]`` (transformers' conversion mapping);
- ``shared.gate, shared.up [D, S]``, ``shared.down [S, D]`` (``Dense``
  kernels): Qwen3-Next ``shared_expert.{gate,up,down}_proj``, Kimi and
  DeepSeek ``shared_experts.{gate,up,down}_proj``, Granite
  ``shared_mlp.input_linear [2S, D]`` (gate the first ``S`` rows) and
  ``shared_mlp.output_linear``;
- ``shared_gate [D, 1]``: Qwen3-Next ``shared_expert_gate.weight.T``;
- ``selection_bias [E]``, a ``RouterBias`` (not a parameter: no gradient,
  no optimizer): ``e_score_correction_bias``; the train step may move it
  by auxiliary-loss-free balancing (``balance``).

The experts run as grouped matmuls (``jax.lax.ragged_dot``): the ``N k``
(token, expert) pairs are sorted by expert, multiplied group by group,
and put back; no token is dropped and nothing of shape ``[N, E, F]`` is
formed. Under a mesh whose ``expert`` axis has more than one device (and
divides ``E``), the experts' weights are split over that axis and the
dispatch runs in ``jax.shard_map``: each device gathers the tokens of its
``expert`` group (``all_gather``), runs its own experts on the pairs routed
to them, and the partial outputs are summed back onto the devices that own
the tokens (``psum_scatter``); see docs/training.md (expert parallelism).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from lin_attn_jax.layers import modules
from lin_attn_jax.ops.common import checks, mesh_axes
from lin_attn_jax.ops.common.kernel_sharding import split_axes

_F32 = jnp.float32
SCORES = ("softmax", "sigmoid")
ACTIVATIONS = ("swiglu", "relu2")


class RouterBias(nnx.Variable):
  """A router's selection bias: changed by balancing, never by gradients."""


@dataclasses.dataclass(frozen=True)
class Routing:
  """The routing of ``N`` tokens to their ``k`` experts.

  ``experts [N, k]`` int32 and ``weights [N, k]`` float32 (the combine
  weights), ``logits [N, E]`` float32.
  """
  experts: jax.Array
  weights: jax.Array
  logits: jax.Array


def route(logits, *, top_k: int, score: str = "softmax", bias=None,
          n_groups: int = 1, topk_groups: int = 1,
          normalize_topk: bool = False, routed_scale: float = 1.0):
  """Top-k routing of ``logits [N, E]`` (steps 1 to 3 of the module
  docstring); returns ``(experts [N, k] int32, weights [N, k] float32)``.

  ``bias [E]`` enters the choice only. Gradients flow to ``logits`` through
  the weights; the choice itself is piecewise constant.
  """
  logits = logits.astype(_F32)
  n, e = logits.shape
  scores = (jax.nn.softmax(logits, axis=-1) if score == "softmax"
            else jax.nn.sigmoid(logits))                        # [N, E]
  choice = scores if bias is None else scores + bias.astype(_F32)
  if n_groups > 1:
    grouped = choice.reshape(n, n_groups, e // n_groups)        # [N, G, E/G]
    group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [N, G]
    kept = jax.lax.top_k(group_scores, topk_groups)[1]          # [N, g]
    keep = jnp.any(kept[:, :, None] == jnp.arange(n_groups), axis=1)
    keep = jnp.repeat(keep, e // n_groups, axis=1)              # [N, E]
    choice = jnp.where(keep, choice, -jnp.inf)
  experts = jax.lax.top_k(jax.lax.stop_gradient(choice), top_k)[1]
  weights = jnp.take_along_axis(scores, experts, axis=-1)       # [N, k]
  if normalize_topk:
    weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
  return experts.astype(jnp.int32), weights * routed_scale


def balance_picks(logits, top_k: int):
  """``[N, k]`` int32: the top-k of ``softmax(logits [N, E])``, the
  assignments transformers' ``load_balancing_loss_func`` counts."""
  probs = jax.nn.softmax(logits.astype(_F32), axis=-1)
  return jax.lax.top_k(probs, top_k)[1].astype(jnp.int32)


def router_stats(logits, experts, picked, mask) -> dict:
  """Per-layer sums for the load-balancing loss and for balancing.

  As transformers' ``load_balancing_loss_func``: the assignments counted
  are ``picked``, the top-k of ``softmax(logits)`` (``balance_picks``),
  whatever the router's own choice (so for a sigmoid, biased or grouped
  router this is transformers' formula, not the router's picks); ``load``
  counts the router's actual choice ``experts``.

  Args:
    logits: ``[N, E]`` float32 router logits.
    experts: ``[N, k]`` int32, the chosen experts.
    picked: ``[N, k]`` int32, ``balance_picks(logits, k)``.
    mask: ``[N]`` float32, 1 on tokens that count (not padding).

  Returns:
    ``{"assigned": [E], "probs": [E], "tokens": [], "load": [E]}`` float32:
    top-k assignments and softmax probabilities summed over the counted
    tokens, their number, and the counted assignments of the actual choice.
  """
  e = logits.shape[-1]
  probs = jax.nn.softmax(logits.astype(_F32), axis=-1)          # [N, E]
  assigned = jnp.sum(jax.nn.one_hot(picked, e, dtype=_F32), axis=1)  # [N, E]
  chosen = jnp.sum(jax.nn.one_hot(experts, e, dtype=_F32), axis=1)
  return {"assigned": mask @ assigned, "probs": mask @ probs,
          "tokens": jnp.sum(mask), "load": mask @ chosen}


def load_balancing_loss(stats) -> jax.Array:
  """Switch Transformer's loss over layers, as transformers computes it:
  ``E * sum_e f_e P_e`` with ``f_e`` the top-k assignments and ``P_e`` the
  softmax probabilities of expert ``e``, each summed over every layer's
  counted tokens and divided by their total (``stats``: a sequence of
  ``router_stats`` of layers with the same ``E``). Float32 scalar."""
  tokens = jnp.maximum(sum(s["tokens"] for s in stats), 1.0)
  assigned = sum(s["assigned"] for s in stats) / tokens          # [E]
  probs = sum(s["probs"] for s in stats) / tokens                # [E]
  return assigned.shape[0] * jnp.sum(assigned * probs)


def _rowwise(fn, rows, whole=()):
  """``fn(*rows, *whole)`` for ``rows``, arrays ``[B, T, ...]`` whose
  tokens are independent, and ``whole``, arrays every token reads.

  Under a mesh it runs in ``jax.shard_map`` on each device's own tokens
  (rows split over the batch axes and the length over ``sequence``, where
  they divide): XLA's partitioner gathers every token onto every device
  for a ``top_k`` it is left to place.
  """
  mesh = jax.sharding.get_abstract_mesh()
  b, t = rows[0].shape[:2]
  batch_axes = () if mesh.empty else split_axes(mesh, mesh_axes.BATCH_AXES, b)
  seq_axes = () if mesh.empty else split_axes(
      mesh, (mesh_axes.SEQUENCE_AXIS,), t)
  if not batch_axes and not seq_axes:
    return fn(*rows, *whole)

  def spec(a):
    return PartitionSpec(batch_axes or None, seq_axes or None,
                         *([None] * (a.ndim - 2)))

  out = jax.eval_shape(fn, *rows, *whole)
  return jax.shard_map(
      fn, in_specs=tuple(spec(a) for a in rows)
      + tuple(PartitionSpec() for _ in whole),
      out_specs=jax.tree.map(spec, out))(*rows, *whole)


def _expert_mlp(x, experts, weights, gate, up, down, first, *, dtype):
  """The routed experts ``first .. first + E_l - 1`` of ``x [N, D]``.

  ``experts, weights [N, k]``; ``gate, up [E_l, D, F]``, ``down [E_l, F,
  D]``; ``first`` int32 scalar. Pairs routed elsewhere contribute zero.
  ``gate`` None: the experts are ``down(relu(up x)^2)``.
  Returns ``[N, D]`` in ``dtype`` (products accumulated in float32).
  """
  n, k = experts.shape
  local_experts = up.shape[0]
  local = experts.reshape(-1) - first                           # [N k]
  here = (local >= 0) & (local < local_experts)
  key = jnp.where(here, local, local_experts)
  order = jnp.argsort(key, stable=True)                         # [N k]
  sizes = jnp.bincount(key, length=local_experts + 1)[:local_experts]
  sizes = sizes.astype(jnp.int32)                               # [E_l]
  rows = x[order // k].astype(dtype)                            # [N k, D]

  def grouped(lhs, w):
    return jax.lax.ragged_dot(lhs, w.astype(dtype), sizes,
                              preferred_element_type=_F32)

  if gate is None:
    hidden = jnp.square(jax.nn.relu(grouped(rows, up)))         # [N k, F]
  else:
    hidden = jax.nn.silu(grouped(rows, gate)) * grouped(rows, up)  # [N k, F]
  out = grouped(hidden.astype(dtype), down)                     # [N k, D]
  scale = jnp.where(here, weights.reshape(-1), 0.0)[order]      # [N k]
  out = jnp.where(here[order][:, None], out * scale[:, None], 0.0)
  inverse = jnp.zeros_like(order).at[order].set(
      jnp.arange(n * k, dtype=order.dtype))
  out = out[inverse].reshape(n, k, -1)                          # [N, k, D]
  return jnp.sum(out, axis=1).astype(dtype)


def routed_experts(x, experts, weights, gate, up, down, *, dtype):
  """``sum_i w_i E_i(x)`` of ``x [B, T, D]`` with ``experts, weights [B, T,
  k]`` and the expert weights ``gate, up [E, D, F]``, ``down [E, F, D]``
  (``gate`` None: non-gated squared-ReLU experts); ``[B, T, D]`` in
  ``dtype``.

  Without a mesh (or with an ``expert`` axis of one device) the experts run
  where the tokens are. Under a mesh whose ``expert`` axis has ``P > 1``
  devices and divides ``E``, each device holds ``E / P`` experts and runs
  ``_expert_mlp`` on the tokens of its ``expert`` group in ``shard_map``:
  rows split over ``expert`` are gathered before and the outputs
  reduce-scattered after; rows not split over it are already whole, and
  the outputs are summed (``psum``).
  """
  b, t, d = x.shape
  e = up.shape[0]
  mesh = jax.sharding.get_abstract_mesh()
  sizes = dict(getattr(mesh, "shape", {}) or {})
  parts = sizes.get(mesh_axes.EXPERT_AXIS, 1)
  if mesh.empty or parts == 1 or e % parts:
    flat = _expert_mlp(x.reshape(b * t, d), experts.reshape(b * t, -1),
                       weights.reshape(b * t, -1), gate, up, down,
                       jnp.int32(0), dtype=dtype)
    return flat.reshape(b, t, d)
  batch_axes = split_axes(mesh, mesh_axes.BATCH_AXES, b)
  seq_axes = split_axes(mesh, (mesh_axes.SEQUENCE_AXIS,), t)
  gathered = mesh_axes.EXPERT_AXIS in batch_axes
  rows = PartitionSpec(batch_axes or None, seq_axes or None, None)
  experts_spec = PartitionSpec(mesh_axes.EXPERT_AXIS, None, None)

  gated = gate is not None

  def local(x, experts, weights, *expert_weights):
    gate, up, down = expert_weights if gated else (None, *expert_weights)
    if gathered:
      x, experts, weights = (
          jax.lax.all_gather(a, mesh_axes.EXPERT_AXIS, axis=0, tiled=True)
          for a in (x, experts, weights))
    lb, lt = x.shape[:2]
    first = (jax.lax.axis_index(mesh_axes.EXPERT_AXIS) * up.shape[0]
             ).astype(jnp.int32)
    y = _expert_mlp(x.reshape(lb * lt, d), experts.reshape(lb * lt, -1),
                    weights.reshape(lb * lt, -1), gate, up, down, first,
                    dtype=dtype).reshape(lb, lt, d)
    if gathered:
      return jax.lax.psum_scatter(y, mesh_axes.EXPERT_AXIS,
                                  scatter_dimension=0, tiled=True)
    return jax.lax.psum(y, mesh_axes.EXPERT_AXIS)

  expert_weights = (gate, up, down) if gated else (up, down)
  return jax.shard_map(
      local, in_specs=(rows, rows, rows)
      + (experts_spec,) * len(expert_weights),
      out_specs=rows)(x, experts, weights, *expert_weights)


class MoE(nnx.Module):
  """The mixture-of-experts MLP of the module docstring.

  Args:
    d_model: ``D``.
    n_experts: ``E``, the routed experts.
    top_k: ``k``, experts per token.
    expert_dim: ``F``, every routed expert's hidden width.
    score: ``"softmax"`` or ``"sigmoid"``, the router's scores.
    normalize_topk: the chosen weights are divided by their sum.
    routed_scale: a factor on the chosen weights (after normalising).
    selection_bias: a per-expert bias added to the scores for the choice
      only (``RouterBias``, zeros at init).
    n_groups, topk_groups: grouped choice (``n_groups`` divides ``E`` into
      groups of at least two; 1 is no grouping).
    shared_dim: hidden width of the shared expert (0: none).
    shared_gate: the shared expert's output is multiplied by
      ``sigmoid(x w_g)``.
    activation: ``"swiglu"`` (gated experts) or ``"relu2"`` (``down(relu(up
      x)^2)``, no ``gate`` parameters, the shared expert likewise).
    rngs, dtype, param_dtype: as every layer.

  Inits: router and experts LeCun normal over their input width, the
  shared expert as ``modules.dense``.
  """

  def __init__(self, d_model: int, *, n_experts: int, top_k: int,
               expert_dim: int, score: str = "softmax",
               normalize_topk: bool = False, routed_scale: float = 1.0,
               selection_bias: bool = False, n_groups: int = 1,
               topk_groups: int = 1, shared_dim: int = 0,
               shared_gate: bool = False, activation: str = "swiglu",
               rngs: nnx.Rngs,
               dtype=jnp.float32, param_dtype=jnp.float32):
    for name, value in (("d_model", d_model), ("n_experts", n_experts),
                        ("top_k", top_k), ("expert_dim", expert_dim),
                        ("n_groups", n_groups), ("topk_groups", topk_groups)):
      checks.positive_int(name, value)
    if score not in SCORES:
      raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if activation not in ACTIVATIONS:
      raise ValueError(f"activation must be one of {ACTIVATIONS}, got "
                       f"{activation!r}")
    if top_k > n_experts:
      raise ValueError(f"top_k = {top_k} exceeds n_experts = {n_experts}")
    if n_experts % n_groups or (n_groups > 1 and n_experts // n_groups < 2):
      raise ValueError(f"n_groups = {n_groups} must divide n_experts = "
                       f"{n_experts} into groups of at least 2")
    if topk_groups > n_groups:
      raise ValueError(f"topk_groups = {topk_groups} exceeds n_groups = "
                       f"{n_groups}")
    if n_groups > 1 and top_k > topk_groups * (n_experts // n_groups):
      raise ValueError(f"top_k = {top_k} exceeds the experts of the "
                       f"topk_groups = {topk_groups} kept groups")
    if not isinstance(shared_dim, int) or shared_dim < 0:
      raise ValueError(f"shared_dim must be an int >= 0, got {shared_dim!r}")
    if shared_gate and not shared_dim:
      raise ValueError("shared_gate needs a shared expert (shared_dim > 0)")
    self.n_experts, self.top_k, self.score = n_experts, top_k, score
    self.normalize_topk, self.routed_scale = normalize_topk, routed_scale
    self.n_groups, self.topk_groups = n_groups, topk_groups
    self.dtype = dtype
    init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1)
    self.router = modules.param(rngs, init, (d_model, n_experts),
                                ("embed", None), param_dtype)
    self.gate = (modules.param(rngs, init, (n_experts, d_model, expert_dim),
                               ("expert", "embed", "mlp"), param_dtype)
                 if activation == "swiglu" else None)
    self.up = modules.param(rngs, init, (n_experts, d_model, expert_dim),
                            ("expert", "embed", "mlp"), param_dtype)
    self.down = modules.param(rngs, init, (n_experts, expert_dim, d_model),
                              ("expert", "mlp", "embed"), param_dtype)
    self.selection_bias = (RouterBias(jnp.zeros((n_experts,), _F32))
                           if selection_bias else None)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    if shared_dim:
      self.shared = SharedExpert(d_model, shared_dim, **kw,
                                 gated=activation == "swiglu")
      self.shared_gate = (modules.dense(d_model, 1, ("embed", None), **kw)
                          if shared_gate else None)
    else:
      self.shared = self.shared_gate = None

  def routing(self, x) -> Routing:
    """The ``Routing`` of ``x [N, D]``."""
    logits = x.astype(_F32) @ self.router[...].astype(_F32)     # [N, E]
    experts, weights, _ = self._choose(logits[None])
    return Routing(experts[0], weights[0], logits)

  def _choose(self, logits):
    """``logits [B, T, E]`` -> experts, weights and ``balance_picks``, each
    ``[B, T, k]``, token by token (``_rowwise``)."""
    whole = () if self.selection_bias is None else (self.selection_bias[...],)

    def choose(logits, *bias):
      b, t, e = logits.shape
      flat = logits.reshape(b * t, e)
      experts, weights = route(
          flat, top_k=self.top_k, score=self.score,
          bias=bias[0] if bias else None, n_groups=self.n_groups,
          topk_groups=self.topk_groups, normalize_topk=self.normalize_topk,
          routed_scale=self.routed_scale)
      picked = balance_picks(flat, self.top_k)
      return tuple(a.reshape(b, t, -1) for a in (experts, weights, picked))

    return _rowwise(choose, (logits,), whole)

  def __call__(self, x, mask=None):
    """``x: [B, T, D]``, ``mask: [B, T]`` (1 where a token counts in the
    statistics; None: all) -> ``(y [B, T, D] in x's dtype, router_stats)``.
    """
    checks.check_rank("x", x, 3, "[B, T, D]")
    b, t, d = checks.shape_of(x)
    logits = jnp.einsum("btd,de->bte", x.astype(_F32),
                        self.router[...].astype(_F32))          # [B, T, E]
    experts, weights, picked = self._choose(logits)
    mask = (jnp.ones((b * t,), _F32) if mask is None
            else jnp.asarray(mask, _F32).reshape(b * t))
    stats = router_stats(logits.reshape(b * t, -1),
                         experts.reshape(b * t, -1),
                         picked.reshape(b * t, -1), mask)
    dtype = self.dtype or x.dtype
    gate = None if self.gate is None else self.gate[...]
    y = routed_experts(x, experts, weights, gate, self.up[...],
                       self.down[...], dtype=dtype)
    if self.shared is not None:
      shared = self.shared(x)
      if self.shared_gate is not None:
        shared = jax.nn.sigmoid(self.shared_gate(x)) * shared
      y = y + shared.astype(y.dtype)
    return y.astype(x.dtype), stats

  def balance(self, load, rate: float) -> None:
    """Auxiliary-loss-free balancing (DeepSeek-V3): ``b += rate *
    sign(mean(load) - load)`` for ``load [E]``, the tokens each expert
    took. No-op without a selection bias."""
    if self.selection_bias is None:
      return
    load = jnp.asarray(load, _F32)
    step = rate * jnp.sign(jnp.mean(load) - load)
    self.selection_bias[...] = self.selection_bias[...] + step


class SharedExpert(nnx.Module):
  """``down(silu(gate(x)) * up(x))``, the SwiGLU every token runs;
  ``down(relu(up(x))^2)`` without ``gated``."""

  def __init__(self, d_model: int, hidden: int, *, rngs, dtype,
               param_dtype, gated: bool = True):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.gate = (modules.dense(d_model, hidden, ("embed", "mlp"), **kw)
                 if gated else None)
    self.up = modules.dense(d_model, hidden, ("embed", "mlp"), **kw)
    self.down = modules.dense(hidden, d_model, ("mlp", "embed"), **kw)

  def __call__(self, x):
    if self.gate is None:
      return self.down(jnp.square(jax.nn.relu(self.up(x))))
    return self.down(jax.nn.silu(self.gate(x)) * self.up(x))

