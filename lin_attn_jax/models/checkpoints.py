"""Saving and restoring an LM's parameters and variables with Orbax.

One Orbax checkpoint holds ``{"params": ..., "variables": ...}``: the
``nnx.Param`` leaves, and the other variables that define the model
(``STORED_VARIABLES``: the routers' selection biases ``RouterBias``, fixed
random projections), each a nested dict of arrays. RNG state is not stored.
Checkpoints written before variables were stored hold the parameters alone
at the top level; they still restore, and then leave the model's variables
as they are. The config that built the model is the caller's to keep.
Restoring checks every shape against the model it is restored into.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

PARAMS_KEY = "params"
VARIABLES_KEY = "variables"
# The non-parameter variables a checkpoint holds: all but RNG state.
STORED_VARIABLES = nnx.All(nnx.Not(nnx.Param), nnx.Not(nnx.RngState))


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
  """Writes the parameters and stored variables of ``model`` to the
  directory ``path`` (new, or replaced when ``force``)."""
  tree = {PARAMS_KEY: _string_keys(
      nnx.to_pure_dict(nnx.state(model, nnx.Param)))}
  variables = _string_keys(nnx.to_pure_dict(nnx.state(model,
                                                      STORED_VARIABLES)))
  if jax.tree.leaves(variables):
    tree[VARIABLES_KEY] = variables
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(_local(path), tree, force=force)


def _stored_tree(checkpointer, path: str):
  stored = checkpointer.metadata(path)
  stored = getattr(stored, "item_metadata", stored)
  return getattr(stored, "tree", stored)


def _is_current(stored) -> bool:
  """Whether ``stored`` has the ``{"params", "variables"}`` layout (older
  checkpoints hold the LM's parameters at the top level)."""
  keys = set(stored)
  return PARAMS_KEY in keys and keys <= {PARAMS_KEY, VARIABLES_KEY}


def _abstract(x):
  return jax.ShapeDtypeStruct(np.shape(x), x.dtype,
                              sharding=getattr(x, "sharding", None))


def _restore(path: str, params: nnx.State, variables: nnx.State | None):
  """``(params, variables)``: new states shaped like the targets, the
  variables that the checkpoint lacks as they were."""
  path = _local(path)
  pure = nnx.to_pure_dict(jax.tree.map(lambda x: x, params))
  want = _string_keys(jax.tree.map(_abstract, pure))
  with ocp.StandardCheckpointer() as checkpointer:
    stored = _stored_tree(checkpointer, path)
    current = _is_current(stored)
    stored_params = stored[PARAMS_KEY] if current else stored
    have = _shapes(stored_params)
    if have != _shapes(want):
      diff = sorted(set(have.items()) ^ set(_shapes(want).items()))
      raise ValueError(f"checkpoint at {path} does not fit the model; "
                       f"entries that differ (name, shape): {diff[:8]}")
    if not current:
      restored, stored_vars = checkpointer.restore(path, want), {}
    else:
      # Every stored variable is restored (they are small); the ones the
      # target holds take its sharding, the others are left unplaced.
      wanted_vars = ({} if variables is None else _named_leaves(_string_keys(
          nnx.to_pure_dict(jax.tree.map(lambda x: x, variables)))))
      vars_meta = stored.get(VARIABLES_KEY, {})
      abstract_vars = jax.tree_util.tree_map_with_path(
          lambda p, m: jax.ShapeDtypeStruct(
              tuple(m.shape), m.dtype, sharding=getattr(wanted_vars.get(
                  tuple(str(getattr(k, "key", k)) for k in p)), "sharding",
                                                        None)),
          vars_meta)
      tree = {PARAMS_KEY: want}
      if vars_meta:
        tree[VARIABLES_KEY] = abstract_vars
      out = checkpointer.restore(path, tree)
      restored, stored_vars = out[PARAMS_KEY], out.get(VARIABLES_KEY, {})
  # Leaves are matched by name: restored keys are strings, the model's list
  # indices are ints, and "10" sorts before "2" where 10 sorts after 2.
  by_name = _named_leaves(restored)
  leaves = [by_name[name] for name in _named_leaves(pure)]
  params = jax.tree.map(lambda x: x, params)
  nnx.replace_by_pure_dict(
      params, jax.tree.unflatten(jax.tree.structure(pure), leaves))
  if variables is None:
    return params, None
  stored_by_name = _named_leaves(stored_vars)
  target = nnx.to_pure_dict(jax.tree.map(lambda x: x, variables))
  new = []
  for name, leaf in _named_leaves(target).items():
    value = stored_by_name.get(name, leaf)
    if np.shape(value) != np.shape(leaf):
      raise ValueError(f"checkpoint at {path} stores the variable "
                       f"{'/'.join(name)} with shape {np.shape(value)}, the "
                       f"model's is {np.shape(leaf)}")
    new.append(value)
  variables = jax.tree.map(lambda x: x, variables)
  nnx.replace_by_pure_dict(
      variables, jax.tree.unflatten(jax.tree.structure(target), new))
  return params, variables


def load_params(path: str, target: nnx.State) -> nnx.State:
  """Parameters saved by ``save_params``, as a new state shaped like
  ``target``.

  ``target`` is an ``nnx.Param`` state of arrays, or of
  ``jax.ShapeDtypeStruct`` with shardings: every restored array takes its
  target's sharding (so a model too large for one device restores sharded).

  Raises ``ValueError`` when the stored names or shapes differ from the
  target's.
  """
  return _restore(path, target, None)[0]


def load_variables(path: str, params: nnx.State, variables: nnx.State
                   ) -> tuple[nnx.State, nnx.State]:
  """``(params, variables)`` saved by ``save_params``, shaped like the
  targets ``params`` (an ``nnx.Param`` state, as for ``load_params``) and
  ``variables`` (a state of concrete non-parameter variables, e.g. a
  trainer's ``rest``). Variables the checkpoint does not hold (one written
  before variables were stored, or RNG state) keep their target values."""
  return _restore(path, params, variables)


def restore_params(path: str, model: nnx.Module) -> nnx.Module:
  """Loads the parameters and variables saved by ``save_params`` into
  ``model`` (in place).

  Raises ``ValueError`` when the stored names or shapes differ from the
  model's.
  """
  params, variables = load_variables(path, nnx.state(model, nnx.Param),
                                     nnx.state(model, STORED_VARIABLES))
  nnx.update(model, params, variables)
  return model
