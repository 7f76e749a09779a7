"""Device meshes and the logical axis rules that place parameters and
activations on them.

One mesh with five named axes, always in this order:

- ``data``: pure data parallelism (batch rows; parameters replicated);
- ``fsdp``: batch rows too, and parameters and optimizer state sharded
  (ZeRO-3 / fully sharded data parallelism);
- ``expert``: expert parallelism: the experts of the mixture-of-experts
  MLPs (``layers/moe.py``) are split over it, and batch rows too (the rest
  of the model is data parallel over it);
- ``tensor``: tensor (model) parallelism over heads, MLP width and vocabulary;
- ``sequence``: context parallelism over the length axis.

Axes a run does not use have size 1, so code never needs to ask which axes
exist. Parameters declare logical axis names (``layers/modules.py``:
``embed``, ``heads``, ``mlp``, ``vocab``, ``rank``, ``state``, ``conv``,
``expert``);
activations use ``batch``, ``length``, ``act_embed``, ``act_heads`` and
``act_vocab``. A ``Rules`` table maps logical names to mesh axes, and the
presets in ``PRESETS`` pick one:

- ``"dp"``: everything replicated, batch over ``data`` x ``fsdp``;
- ``"fsdp"``: every parameter sharded over ``fsdp`` on its first dimension
  that divides;
- ``"fsdp_tp"``: heads, MLP width and vocabulary over ``tensor``, the other
  large dimension over ``fsdp``.

Every preset places the experts (logical ``expert``) over ``expert``.

The mesh's axis types are ``Auto``: XLA's partitioner propagates shardings
through the ops (scans, custom VJPs, Pallas calls inside ``shard_map``) and
we pin only parameters, optimizer state and the activations between blocks.
``Explicit`` axes would make every einsum, reshape and scan of every op carry
a sharding in its type, which the ops were not written for, and buys nothing
here: placement at the block boundaries is what decides memory and traffic.

Example (eight fake CPU devices)::

    mesh = make_mesh("fsdp=4,tensor=2")
    rules = PRESETS["fsdp_tp"]
    with jax.set_mesh(mesh), use_rules(rules):
      y = constrain(x, ("batch", "length", "act_embed"))
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lin_attn_jax.ops.common.mesh_axes import (BATCH_AXES, EXPERT_AXIS,
                                               MESH_AXES, SEQUENCE_AXIS,
                                               TENSOR_AXIS)


def parse_mesh_spec(spec: str | Mapping[str, int] | None,
                    num_devices: int) -> dict[str, int]:
  """Axis sizes from ``"data=2,fsdp=-1"`` (or a dict); missing axes are 1.

  One axis may be ``-1``: it takes the devices the others leave. ``None`` or
  ``""`` means ``fsdp=-1`` (all devices on ``fsdp``).

  Raises:
    ValueError: an unknown axis, a malformed entry, more than one ``-1``, or
      sizes whose product is not ``num_devices``.
  """
  if not spec:
    spec = {"fsdp": -1}
  if isinstance(spec, str):
    entries = {}
    for item in spec.split(","):
      item = item.strip()
      if not item:
        continue
      name, sep, value = item.partition("=")
      name = name.strip()
      try:
        size = int(value)
      except ValueError:
        size = None
      if not sep or size is None:
        raise ValueError(f"mesh entry {item!r} must look like 'fsdp=4' "
                         f"(axis=size) in mesh spec {spec!r}")
      if name in entries:
        raise ValueError(f"mesh axis {name!r} given twice in {spec!r}")
      entries[name] = size
    spec = entries
  sizes = dict(spec)
  unknown = sorted(set(sizes) - set(MESH_AXES))
  if unknown:
    raise ValueError(f"unknown mesh axis {unknown}; the axes are {MESH_AXES}")
  rest = [name for name, size in sizes.items() if size == -1]
  if len(rest) > 1:
    raise ValueError(f"only one mesh axis may be -1, got {rest}")
  for name, size in sizes.items():
    if size != -1 and (not isinstance(size, int) or size < 1):
      raise ValueError(f"mesh axis {name} must have a positive size or -1, "
                       f"got {size!r}")
  known = math.prod(size for size in sizes.values() if size != -1)
  if rest:
    if num_devices % known:
      raise ValueError(f"mesh {_show(sizes)}: the fixed axes take {known} "
                       f"devices, which does not divide the {num_devices} "
                       "devices")
    sizes[rest[0]] = num_devices // known
  full = {name: sizes.get(name, 1) for name in MESH_AXES}
  if math.prod(full.values()) != num_devices:
    raise ValueError(f"mesh {_show(full)} needs {math.prod(full.values())} "
                     f"devices, but there are {num_devices}")
  return full


def _show(sizes: Mapping[str, int]) -> str:
  return ",".join(f"{name}={size}" for name, size in sizes.items())


def make_mesh(spec: str | Mapping[str, int] | None = None,
              devices: Sequence[Any] | None = None) -> Mesh:
  """A mesh with the axes ``MESH_AXES`` (Auto axis types) over ``devices``.

  ``devices`` defaults to every device of every process (``jax.devices()``);
  ``jax.make_mesh`` orders them for the physical topology.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = parse_mesh_spec(spec, len(devices))
  shape = tuple(sizes[name] for name in MESH_AXES)
  return jax.make_mesh(shape, MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(shape),
                       devices=devices)


@dataclasses.dataclass(frozen=True)
class Rules:
  """An ordered table of ``(logical name, mesh axes)`` pairs.

  A name may appear several times: the candidates are tried in order. For
  an array, dimensions are placed left to right; a dimension takes the first
  candidate whose mesh axes are not already used by the array and whose
  size product divides the dimension. A dimension with no fitting candidate
  (or a logical name with no rule, or ``None``) is replicated.
  """

  # Short name of the table (for messages and checkpoints).
  name: str
  # ((logical name, mesh axis or tuple of mesh axes), ...).
  table: tuple[tuple[str, str | tuple[str, ...]], ...]

  def candidates(self, logical: str | None) -> list[tuple[str, ...]]:
    if logical is None:
      return []
    found = []
    for name, axes in self.table:
      if name == logical:
        found.append((axes,) if isinstance(axes, str) else tuple(axes))
    return found

  def spec(self, shape: Sequence[int], logical: Sequence[str | None],
           mesh_shape: Mapping[str, int]) -> PartitionSpec:
    """The ``PartitionSpec`` of an array of ``shape`` with ``logical`` axes."""
    if len(shape) != len(logical):
      raise ValueError(f"logical axes {tuple(logical)} do not match the "
                       f"shape {tuple(shape)}")
    used: set[str] = set()
    out = []
    for size, name in zip(shape, logical):
      placed = None
      for axes in self.candidates(name):
        axes = tuple(a for a in axes if mesh_shape.get(a, 1) > 1)
        if not axes or used & set(axes):
          continue
        if size % math.prod(mesh_shape[a] for a in axes) == 0:
          placed = axes
          break
      if placed:
        used.update(placed)
        out.append(placed[0] if len(placed) == 1 else placed)
      else:
        out.append(None)
    return PartitionSpec(*out)


_ACTIVATIONS = (("batch", BATCH_AXES), ("length", SEQUENCE_AXIS),
                ("expert", EXPERT_AXIS))

PRESETS: dict[str, Rules] = {
    "dp": Rules("dp", _ACTIVATIONS),
    "fsdp": Rules("fsdp", _ACTIVATIONS + tuple(
        (name, "fsdp") for name in
        ("embed", "vocab", "heads", "mlp", "rank", "state"))),
    "fsdp_tp": Rules("fsdp_tp", _ACTIVATIONS + (
        ("heads", TENSOR_AXIS), ("mlp", TENSOR_AXIS), ("vocab", TENSOR_AXIS),
        ("act_heads", TENSOR_AXIS), ("act_vocab", TENSOR_AXIS),
    ) + tuple((name, "fsdp") for name in
              ("embed", "heads", "mlp", "vocab", "rank", "state"))),
}


def get_rules(rules: str | Rules) -> Rules:
  """A preset by name, or ``rules`` itself."""
  if isinstance(rules, Rules):
    return rules
  if rules not in PRESETS:
    raise ValueError(f"unknown sharding rules {rules!r}; presets: "
                     f"{sorted(PRESETS)}")
  return PRESETS[rules]


class _Current(threading.local):
  rules: Rules | None = None


_current = _Current()


@contextlib.contextmanager
def use_rules(rules: str | Rules):
  """Makes ``rules`` the table that ``constrain`` reads (while tracing)."""
  previous = _current.rules
  _current.rules = get_rules(rules)
  try:
    yield _current.rules
  finally:
    _current.rules = previous


def _mesh_shape(mesh) -> dict[str, int]:
  return dict(zip(mesh.axis_names, mesh.axis_sizes))


def constrain(x, logical: Sequence[str | None]):
  """``x`` pinned to the sharding its ``logical`` axes get under the current
  mesh (``jax.set_mesh``) and rules (``use_rules``); unchanged when either is
  missing, so single-device code pays nothing."""
  mesh = jax.sharding.get_abstract_mesh()
  rules = _current.rules
  if rules is None or mesh.empty or mesh.size == 1:
    return x
  spec = rules.spec(x.shape, logical, _mesh_shape(mesh))
  return jax.lax.with_sharding_constraint(x, spec)


def logical_axes(variable) -> tuple[str | None, ...] | None:
  """The logical axis names a parameter was declared with, or None."""
  names = variable.get_metadata().get("out_sharding")
  return tuple(names) if names else None


def state_shardings(state, mesh: Mesh, rules: str | Rules):
  """``state`` (an ``nnx.State``, concrete or abstract) with every
  variable's value replaced by its ``NamedSharding``, from the variables'
  logical axes; variables without axes are replicated."""
  rules = get_rules(rules)
  shape = _mesh_shape(mesh)

  def place(variable):
    value = variable.get_value()
    names = logical_axes(variable)
    if names is None or not np.shape(value):
      spec = PartitionSpec()
    else:
      spec = rules.spec(np.shape(value), names, shape)
    return variable.replace(NamedSharding(mesh, spec))

  return jax.tree.map(place, state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Batch rows over ``data`` x ``fsdp`` (and the length over ``sequence``)
  for ``[B, T, ...]`` arrays."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, SEQUENCE_AXIS,
                                           *([None] * (ndim - 2))))


def batch_divisor(mesh: Mesh) -> int:
  """How many ways the batch rows are split."""
  shape = _mesh_shape(mesh)
  return math.prod(shape.get(a, 1) for a in BATCH_AXES)


def check_model_fits(config, mesh: Mesh, rules: str | Rules) -> None:
  """Raises ``ValueError`` when a model width cannot be split as the rules
  ask: ``n_heads``, the MLP width or the vocabulary over ``tensor``, the
  model width over ``fsdp``, the experts over ``expert``.

  ``config`` is an ``LMConfig`` (anything with ``n_heads``, ``d_model``,
  ``hidden_dim`` and ``vocab_size``; ``n_experts``, None without experts).
  """
  rules = get_rules(rules)
  shape = _mesh_shape(mesh)
  tensor, fsdp = shape.get(TENSOR_AXIS, 1), shape.get("fsdp", 1)
  checks: list[tuple[str, int, str, int]] = []
  if tensor > 1 and rules.candidates("heads") and any(
      TENSOR_AXIS in axes for axes in rules.candidates("heads")):
    checks += [("n_heads", config.n_heads, TENSOR_AXIS, tensor),
               ("mlp width", config.hidden_dim, TENSOR_AXIS, tensor),
               ("vocab_size", config.vocab_size, TENSOR_AXIS, tensor)]
  if fsdp > 1 and any("fsdp" in axes for axes in rules.candidates("embed")):
    checks.append(("d_model", config.d_model, "fsdp", fsdp))
  experts = getattr(config, "n_experts", None)
  if experts is not None and shape.get(EXPERT_AXIS, 1) > 1:
    checks.append(("n_experts", experts, EXPERT_AXIS, shape[EXPERT_AXIS]))
  for what, size, axis, parts in checks:
    if size % parts:
      hint = (" (pad the vocabulary to a multiple)" if what == "vocab_size"
              else "")
      raise ValueError(f"{what} = {size} is not divisible by the {axis} mesh "
                       f"axis ({parts}){hint}")


def per_device_bytes(tree) -> int:
  """Bytes of ``tree``'s arrays held on the most loaded device."""
  totals: dict[Any, int] = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
  return max(totals.values()) if totals else 0


def describe(mesh: Mesh) -> str:
  """``"data=1,fsdp=8,expert=1,tensor=1,sequence=1"``."""
  return _show(_mesh_shape(mesh))

