"""The architecture-independent half of checkpoint conversion.

An architecture (``architectures.py``) gives the ``LMConfig`` of a
HuggingFace ``config.json`` and a list of ``Entry``: which HF tensors make
which LM parameters, and the two (jnp) functions between them. From the
entries alone this module

- derives the HF tensor names and shapes a config implies (``jax.eval_shape``
  of the export direction on the LM's abstract parameters), so that every
  tensor is checked against them before anything is converted;
- imports (HF tensors -> LM parameters) and exports (LM -> HF tensors).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax.layers.moe import RouterBias
from lin_attn_jax.models.lm import LM, LMConfig

Path = tuple  # a parameter's path in the LM's pure dict, e.g. ("embed", "embedding")


@dataclasses.dataclass(frozen=True)
class Entry:
  """HF tensors ``hf`` <-> LM parameters ``ours`` (paths).

  ``to_ours(*hf_arrays) -> tuple of our arrays`` and ``to_hf(*our_arrays) ->
  tuple of HF arrays`` are inverse jnp functions (float32).
  """
  hf: tuple[str, ...]
  ours: tuple[Path, ...]
  to_ours: Callable
  to_hf: Callable


def transpose(hf: str, ours: Path) -> Entry:
  """A ``torch.nn.Linear`` weight ``[out, in]`` <-> a kernel ``[in, out]``."""
  return Entry((hf,), (ours,), lambda w: (w.T,), lambda k: (k.T,))


def copy(hf: str, ours: Path, hf_shape=None, our_shape=None) -> Entry:
  """Same values; reshaped to ``our_shape`` / ``hf_shape`` where given."""
  return Entry((hf,), (ours,),
               lambda w: (w if our_shape is None else w.reshape(our_shape),),
               lambda p: (p if hf_shape is None else p.reshape(hf_shape),))


def conv(hf: str, ours: Path) -> Entry:
  """A depthwise ``Conv1d`` weight ``[C, 1, W]`` <-> ``[C, W]``."""
  return Entry((hf,), (ours,), lambda w: (w[:, 0, :],),
               lambda p: (p[:, None, :],))


def linear(hf_prefix: str, ours: Path, bias: bool = False) -> list[Entry]:
  """``{hf_prefix}.weight`` (and ``.bias``) <-> ``ours + kernel/bias``."""
  out = [transpose(f"{hf_prefix}.weight", ours + ("kernel",))]
  if bias:
    out.append(copy(f"{hf_prefix}.bias", ours + ("bias",)))
  return out


def head_shared(hf: str, ours: Path, heads: int) -> Entry:
  """A norm weight ``[V]`` shared by every head <-> ``[H * V]``.

  Exporting takes the first head's copy; ``check_head_shared`` refuses
  parameters whose heads differ (the HF layer cannot hold them).
  """
  return Entry((hf,), (ours,), lambda w: (jnp.tile(w, heads),),
               lambda p: (p.reshape(heads, -1)[0],))


def offset_scale(hf: str, ours: Path) -> Entry:
  """A zero-centred norm weight ``w`` (the norm scales by ``1 + w``) <->
  our scale ``1 + w``."""
  return Entry((hf,), (ours,), lambda w: (1.0 + w,), lambda p: (p - 1.0,))


def constant(hf: str, value) -> Entry:
  """A tensor the checkpoint stores but the LM derives from the config (a
  buffer of fixed values): its shape is checked on import, and ``value``
  (an array) is written on export."""
  value = np.asarray(value, np.float32)
  return Entry((hf,), (), lambda w: (), lambda: (jnp.asarray(value),))


# The variables a checkpoint holds: parameters, and the routers' selection
# biases (buffers in transformers, moved by balancing rather than gradients).
LOADED = (nnx.Param, RouterBias)


def loaded_state(lm: LM) -> dict:
  """The ``LOADED`` variables of ``lm`` as a pure dict."""
  return nnx.to_pure_dict(nnx.state(lm, LOADED))


def abstract_params(config: LMConfig):
  """The LM's ``LOADED`` variables as a pure dict of ``ShapeDtypeStruct``
  (float32)."""
  lm = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  pure = loaded_state(lm)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32),
                      pure)


def _get(tree, path: Path):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree, path: Path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _flat_paths(tree) -> set[Path]:
  return {tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_coverage(entries: list[Entry], abstract) -> None:
  """Every LM parameter is made by exactly one entry."""
  made = [p for e in entries for p in e.ours]
  have = _flat_paths(abstract)
  twice = sorted({p for p in made if made.count(p) > 1}, key=str)
  missing = sorted(have - set(made), key=str)
  unknown = sorted(set(made) - have, key=str)
  if twice or missing or unknown:
    raise AssertionError(f"conversion table does not match the LM: made twice "
                         f"{twice[:4]}, not made {missing[:4]}, unknown "
                         f"{unknown[:4]}")


def export_tensors(entries: list[Entry], params) -> dict[str, jax.Array]:
  """HF tensors from LM parameters (a pure dict)."""
  out = {}
  for entry in entries:
    values = entry.to_hf(*(jnp.asarray(_get(params, p), jnp.float32)
                           for p in entry.ours))
    for name, value in zip(entry.hf, values):
      out[name] = value
  return out


def expected_tensors(entries: list[Entry], abstract) -> dict[str, tuple]:
  """The HF tensor names and shapes a config implies."""
  shapes = jax.eval_shape(lambda p: export_tensors(entries, p), abstract)
  return {name: tuple(s.shape) for name, s in shapes.items()}


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def check_tensors(tensors: dict, expected: dict[str, tuple],
                  ignored: Callable[[str], bool]) -> None:
  """``ValueError`` naming the first tensor that is missing, mis-shaped, of
  a dtype the loader cannot hold, or not expected."""
  for name, shape in expected.items():
    if name not in tensors:
      raise ValueError(f"tensor {name!r} is missing from the checkpoint "
                       f"(expected shape {list(shape)})")
    info = tensors[name]
    if tuple(info.shape) != shape:
      raise ValueError(f"tensor {name!r} has shape {list(info.shape)}, the "
                       f"config implies {list(shape)}")
    if info.dtype not in FLOAT_DTYPES:
      raise ValueError(f"tensor {name!r} has dtype {info.dtype}; the loader "
                       f"holds floating-point weights only ({FLOAT_DTYPES})")
  extra = sorted(n for n in tensors if n not in expected and not ignored(n))
  if extra:
    raise ValueError(f"tensor {extra[0]!r} (shape {list(tensors[extra[0]].shape)}"
                     f") is not part of the architecture this config "
                     f"describes; unexpected tensors: {extra[:8]}")


def import_params(entries: list[Entry], tensors: dict[str, np.ndarray],
                  abstract):
  """LM parameters (a pure dict of float32 arrays) from HF tensors."""
  params = {}
  for entry in entries:
    values = entry.to_ours(*(jnp.asarray(np.asarray(tensors[n], np.float32))
                             for n in entry.hf))
    for path, value in zip(entry.ours, values):
      want = _get(abstract, path).shape
      if tuple(value.shape) != tuple(want):
        raise ValueError(f"tensors {list(entry.hf)} give {path} the shape "
                         f"{list(value.shape)}, the model needs {list(want)}")
      _set(params, path, value)
  return params


def _special_floats(obj: dict):
  """``{"__float__": "Infinity"}`` (how transformers 5.x writes a float that
  JSON cannot hold: ``inf``, ``-inf``, ``nan``) -> the float; other objects
  as they are. Older files spell it as the literal ``Infinity``, which
  ``json`` reads as it is."""
  if set(obj) == {"__float__"}:
    return float(obj["__float__"])
  return obj


def read_config(directory: str) -> dict:
  path = os.path.join(directory, "config.json")
  if not os.path.isdir(directory):
    raise ValueError(f"{directory} is not a directory")
  if not os.path.exists(path):
    raise ValueError(f"{directory} has no config.json")
  with open(path) as f:
    return json.load(f, object_hook=_special_floats)


def build_lm(config: LMConfig, params, param_dtype=None) -> LM:
  """An LM of ``config`` holding ``params`` (nothing is drawn at random)."""
  if param_dtype is not None:
    config = dataclasses.replace(config, param_dtype=param_dtype)
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: LM(config, rngs=nnx.Rngs(0))))
  dtype = jnp.dtype(config.param_dtype)
  nnx.replace_by_pure_dict(
      state, jax.tree.map(lambda x: jnp.asarray(x, dtype), params))
  return nnx.merge(graphdef, state)
