"""Saving and restoring an LM's parameters with Orbax.

Only the ``nnx.Param`` leaves are stored (as a nested dict of arrays); the
config that built the model is the caller's to keep. Restoring checks every
shape against the model it is restored into.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx


def _string_keys(tree):
  """Nested dicts with every key a string (list indices become "0", "1")."""
  if isinstance(tree, dict):
    return {str(k): _string_keys(v) for k, v in tree.items()}
  return tree


def _shapes(tree) -> dict[str, tuple[int, ...]]:
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path): tuple(np.shape(leaf))
          for path, leaf in flat}


def _named_leaves(tree) -> dict[tuple[str, ...], object]:
  """Leaves by their path of string keys, in ``tree``'s flattening order."""
  return {tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in path):
          leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _local(path: str) -> str:
  """``path`` made absolute, unless it is a URL (``gs://...``)."""
  return path if "://" in path else os.path.abspath(path)


def save_params(path: str, model: nnx.Module, *, force: bool = False) -> None:
  """Writes the parameters of ``model`` to the directory ``path`` (new, or
  replaced when ``force``)."""
  params = _string_keys(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(_local(path), params, force=force)


def load_params(path: str, target: nnx.State) -> nnx.State:
  """Parameters saved by ``save_params``, as a new state shaped like
  ``target``.

  ``target`` is an ``nnx.Param`` state of arrays, or of
  ``jax.ShapeDtypeStruct`` with shardings: every restored array takes its
  target's sharding (so a model too large for one device restores sharded).

  Raises ``ValueError`` when the stored names or shapes differ from the
  target's.
  """
  path = _local(path)
  pure = nnx.to_pure_dict(jax.tree.map(lambda x: x, target))
  abstract = _string_keys(jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype,
                                     sharding=getattr(x, "sharding", None)),
      pure))
  with ocp.StandardCheckpointer() as checkpointer:
    stored = checkpointer.metadata(path)
    stored = getattr(stored, "item_metadata", stored)
    stored = getattr(stored, "tree", stored)
    have, want = _shapes(stored), _shapes(abstract)
    if have != want:
      diff = sorted(set(have.items()) ^ set(want.items()))
      raise ValueError(f"checkpoint at {path} does not fit the model; "
                       f"entries that differ (name, shape): {diff[:8]}")
    restored = checkpointer.restore(path, abstract)
  # Leaves are matched by name: restored keys are strings, the model's list
  # indices are ints, and "10" sorts before "2" where 10 sorts after 2.
  by_name = _named_leaves(restored)
  leaves = [by_name[name] for name in _named_leaves(pure)]
  state = jax.tree.map(lambda x: x, target)
  nnx.replace_by_pure_dict(
      state, jax.tree.unflatten(jax.tree.structure(pure), leaves))
  return state


def restore_params(path: str, model: nnx.Module) -> nnx.Module:
  """Loads parameters saved by ``save_params`` into ``model`` (in place).

  Raises ``ValueError`` when the stored names or shapes differ from the
  model's.
  """
  nnx.update(model, load_params(path, nnx.state(model, nnx.Param)))
  return model
