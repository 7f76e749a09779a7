"""Pallas kernels under a sharded ``jit``: one call per shard.

XLA cannot partition a ``pallas_call``: under a sharded ``jit`` it gathers
the kernel's operands onto every device. The kernels treat every (batch,
head) pair on its own, so ``per_shard`` runs them inside ``jax.shard_map``
over the batch and head axes instead: each device calls the kernel on its
own rows and heads, and nothing is gathered.

The mesh is the one set with ``jax.set_mesh`` (``jax.sharding.
get_abstract_mesh()``; none set: the kernel runs as it is). The activation
batch axis maps to the mesh axes ``BATCH_AXES`` and heads to
``HEAD_AXES``; an array dimension is split over those of them that the mesh
has with more than one device and whose sizes divide it (in order, while
the product still divides it). The ``sequence`` axis (context parallelism)
is not touched here.

Layouts name each array's axes with letters: ``b`` batch, ``h`` heads, any
other letter an axis that stays whole (``"bthk"`` for ``[B, T, H, K]``).
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import PartitionSpec

from lin_attn_jax.ops.common import mesh_axes

# The mesh axes (``mesh_axes``, as in lin_attn_jax.sharding) that split batch
# rows and heads.
BATCH_AXES = mesh_axes.BATCH_AXES
HEAD_AXES = (mesh_axes.TENSOR_AXIS,)


def split_axes(mesh, names, size: int) -> tuple[str, ...]:
  """The axes of ``names`` in ``mesh`` (more than one device each) that a
  dimension of ``size`` is split over: in order, while their product
  divides ``size``."""
  shape = dict(getattr(mesh, "shape", {}) or {})
  chosen, product = [], 1
  for name in names:
    n = shape.get(name, 1)
    if n > 1 and size % (product * n) == 0:
      chosen.append(name)
      product *= n
  return tuple(chosen)


def per_shard(fn: Callable, arrays: dict, layouts: dict, out_layouts, *,
              batch: int, heads: int):
  """``fn(**arrays)``, inside ``jax.shard_map`` over the current mesh's
  batch and head axes when it has any that split ``batch`` rows and
  ``heads`` heads.

  Args:
    fn: takes ``arrays`` by name (None values are passed as None).
    arrays: ``{name: array or None}``.
    layouts: ``{name: letters}`` for the arrays that are not None (a
      pytree of letters for a pytree of arrays).
    out_layouts: the structure of ``fn``'s result with a letters string per
      array and None where the result holds None.
    batch, heads: ``B`` and ``H`` of the call.
  """
  mesh = jax.sharding.get_abstract_mesh()
  batch_axes = split_axes(mesh, BATCH_AXES, batch)
  head_axes = split_axes(mesh, HEAD_AXES, heads)
  if not batch_axes and not head_axes:
    return fn(**arrays)

  def spec(letters: str) -> PartitionSpec:
    def axis(letter):
      axes = {"b": batch_axes, "h": head_axes}.get(letter, ())
      return None if not axes else axes[0] if len(axes) == 1 else axes
    return PartitionSpec(*(axis(letter) for letter in letters))

  names = [name for name, x in arrays.items() if x is not None]

  def body(*xs):
    return fn(**{**arrays, **dict(zip(names, xs))})

  # check_vma=False: a pallas_call's outputs carry no varying-axes types.
  return jax.shard_map(body, in_specs=tuple(jax.tree.map(spec, layouts[n])
                                      for n in names),
                       out_specs=jax.tree.map(spec, out_layouts),
                       check_vma=False)(*(arrays[n] for n in names))
