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


def save_params(path: str, model: nnx.Module) -> None:
  """Writes the parameters of ``model`` to the directory ``path`` (new)."""
  params = _string_keys(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.abspath(path), params)


def restore_params(path: str, model: nnx.Module) -> nnx.Module:
  """Loads parameters saved by ``save_params`` into ``model`` (in place).

  Raises ``ValueError`` when the stored names or shapes differ from the
  model's.
  """
  path = os.path.abspath(path)
  state = nnx.state(model, nnx.Param)
  pure = nnx.to_pure_dict(state)
  abstract = _string_keys(jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), pure))
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
  flat = {jax.tree_util.keystr(p): leaf for p, leaf in
          jax.tree_util.tree_flatten_with_path(restored)[0]}
  leaves = [flat[jax.tree_util.keystr(p)] for p, _ in
            jax.tree_util.tree_flatten_with_path(abstract)[0]]
  pure = jax.tree.unflatten(jax.tree.structure(pure), leaves)
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(model, state)
  return model
