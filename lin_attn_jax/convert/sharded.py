"""Converting a checkpoint straight into the sharded layout of a mesh.

Every LM parameter is built with ``jax.make_array_from_callback`` under its
``NamedSharding``; the callback of a device computes that device's slice of
the parameter from slices of the HF tensors, read with
``TensorInfo.read_slice`` (a memory map). A process thus reads only what
its devices hold, and no whole tensor is materialised on a host or a
device, except for the entries listed in ``Loaded.whole_reads``.

How an entry (``core.Entry``) maps a slice of its output to slices of its
HF tensors:

- ``transpose``, ``copy`` without a reshape, ``conv`` and ``offset_scale``
  entries slice directly (a transpose swaps the two ranges);
- any other entry whose ``to_ours`` only moves elements (reshapes,
  transposes, splits, concatenations, head tilings) is traced on an int32
  index array of each HF tensor's size: the indices a slice of the output
  takes give the boxes of each HF tensor to read (one per run of
  consecutive leading indices, so that interleaved heads are read only
  where the slice needs them). The index map costs four
  bytes per element of the tensor on the host, transiently; no weight is
  read beyond the box. "Only moves elements" is checked: ``to_ours`` must
  keep integers integers and commute with ``x + 1`` and ``2 * x``;
- an entry that computes values (none of the current tables) is read
  whole, converted and sliced, and named in ``whole_reads``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.convert import core
from lin_attn_jax.convert.safetensors_io import TensorInfo

Index = tuple[slice, ...]


@dataclasses.dataclass
class Loaded:
  """Sharded LM variables (a pure dict of global ``jax.Array``), and the
  HF tensors that had to be read whole (``whole_reads``)."""
  params: dict
  whole_reads: list[str]


def _bounds(index: Index, shape) -> tuple[tuple[int, int], ...]:
  return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _kind(entry: core.Entry) -> str:
  return entry.to_ours.__qualname__.split(".<locals>")[0]


class _Slicer:
  """The slices of one entry's outputs, from slices of its HF tensors."""

  def __init__(self, entry: core.Entry, infos: list[TensorInfo],
               out_shapes: list[tuple[int, ...]]):
    self.entry, self.infos, self.out_shapes = entry, infos, out_shapes
    kind = _kind(entry)
    same = [tuple(i.shape) for i in infos] == out_shapes
    if kind == "transpose":
      self.mode = "transpose"
    elif kind in ("copy", "offset_scale") and same:
      self.mode = "elementwise"
    elif kind == "conv":
      self.mode = "conv"
    else:
      self.maps = self._index_maps()
      self.mode = "gather" if self.maps is not None else "whole"
    self.whole = None

  def _index_maps(self):
    """Per output, the flat index into the concatenated HF tensors of each
    element; None when ``to_ours`` does more than move elements."""
    sizes = [math.prod(i.shape) for i in self.infos]
    if sum(sizes) * 2 + 1 >= 2**31:
      return None
    offsets = np.cumsum([0] + sizes[:-1])
    probes = [jnp.arange(n, dtype=jnp.int32).reshape(i.shape) + o
              for n, i, o in zip(sizes, self.infos, offsets)]
    try:
      outs = self.entry.to_ours(*probes)
      shifted = self.entry.to_ours(*(p + 1 for p in probes))
      doubled = self.entry.to_ours(*(2 * p for p in probes))
    except (TypeError, ValueError):
      return None
    for out, plus, twice in zip(outs, shifted, doubled):
      if not jnp.issubdtype(out.dtype, jnp.integer):
        return None
      if not (bool(jnp.all(plus == out + 1))
              and bool(jnp.all(twice == 2 * out))):
        return None
    self.offsets, self.sizes = offsets, sizes
    return [np.asarray(out) for out in outs]

  def _whole_outputs(self):
    if self.whole is None:
      self.whole = [np.asarray(v, np.float32) for v in self.entry.to_ours(
          *(jnp.asarray(np.asarray(i.read(), np.float32))
            for i in self.infos))]
    return self.whole

  def __call__(self, k: int, index: Index) -> np.ndarray:
    """``our_k[index]``, float32."""
    shape = self.out_shapes[k]
    bounds = _bounds(index, shape)
    box = tuple(slice(a, b) for a, b in bounds)
    if self.mode == "elementwise":
      value = np.asarray(self.infos[0].read_slice(box), np.float32)
      return np.asarray(
          self.entry.to_ours(jnp.asarray(value))[0], np.float32)
    if self.mode == "transpose":
      return np.asarray(self.infos[0].read_slice(box[::-1]), np.float32).T
    if self.mode == "conv":
      return np.asarray(self.infos[0].read_slice(
          (box[0], slice(0, 1), box[1])), np.float32)[:, 0, :]
    if self.mode == "whole":
      return self._whole_outputs()[k][box]
    flat = self.maps[k][box]
    out = np.empty(flat.shape, np.float32)
    for j, info in enumerate(self.infos):
      offset, size = self.offsets[j], self.sizes[j]
      mask = (flat >= offset) & (flat < offset + size)
      if mask.any():
        out[mask] = self._gather(info, flat[mask] - offset)
    return out

  @staticmethod
  def _gather(info: TensorInfo, flat: np.ndarray) -> np.ndarray:
    """``info``'s elements at the flat indices ``flat``, read as one box per
    run of consecutive leading indices (rows of interleaved heads are not
    read for the heads between them)."""
    if not info.shape:
      return np.full(flat.shape, info.read_slice(()), np.float32)
    coords = np.unravel_index(flat, info.shape)
    rows = np.unique(coords[0])
    breaks = np.flatnonzero(np.diff(rows) > 1)
    out = np.empty(flat.shape, np.float32)
    for run in np.split(rows, breaks + 1):
      here = (coords[0] >= run[0]) & (coords[0] <= run[-1])
      sub = [c[here] for c in coords]
      lows = [int(c.min()) for c in sub]
      part = info.read_slice(tuple(
          slice(lo, int(c.max()) + 1) for lo, c in zip(lows, sub)))
      out[here] = np.asarray(part, np.float32)[
          tuple(c - lo for c, lo in zip(sub, lows))]
    return out


def sharded_params(entries: list[core.Entry], tensors: dict[str, TensorInfo],
                   abstract, shardings, dtype) -> Loaded:
  """The LM variables of ``entries`` built from the checkpoint ``tensors``
  (``TensorInfo`` by name) as global arrays of ``dtype`` placed by
  ``shardings`` (a pure dict of ``NamedSharding`` shaped like
  ``abstract``); each process reads only the slices its devices hold."""
  params, whole = {}, []
  for entry in entries:
    if not entry.ours:
      continue
    shapes = [tuple(core._get(abstract, p).shape) for p in entry.ours]
    slicer = _Slicer(entry, [tensors[n] for n in entry.hf], shapes)
    if slicer.mode == "whole":
      whole.extend(entry.hf)
    for k, path in enumerate(entry.ours):
      read: dict = {}

      def callback(index, k=k, read=read):
        key = _bounds(index, shapes[k])
        if key not in read:
          read[key] = slicer(k, index).astype(dtype)
        return read[key]

      _check_shapes(entry, slicer, k, shapes[k])
      core._set(params, path, jax.make_array_from_callback(
          shapes[k], core._get(shardings, path), callback))
  return Loaded(params, whole)


def _check_shapes(entry, slicer, k, want) -> None:
  """The entry's output shape is the model's (checked without reading)."""
  got = jax.eval_shape(entry.to_ours, *(
      jax.ShapeDtypeStruct(i.shape, jnp.float32) for i in slicer.infos))[k]
  if tuple(got.shape) != tuple(want):
    raise ValueError(f"tensors {list(entry.hf)} give {entry.ours[k]} the "
                     f"shape {list(got.shape)}, the model needs {list(want)}")
