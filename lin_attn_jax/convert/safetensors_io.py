"""Reading and writing the safetensors format with numpy alone.

A file is an 8-byte little-endian header length, a JSON header mapping each
tensor's name to ``{"dtype", "shape", "data_offsets"}`` (offsets into the
byte buffer after the header), and the buffer. Sharded checkpoints add
``model.safetensors.index.json`` whose ``weight_map`` names the file of each
tensor. No torch and no ``safetensors`` package are needed, so loading a
checkpoint needs only the core dependencies; bfloat16 comes from
``ml_dtypes`` (a dependency of JAX).
"""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np

DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class TensorInfo:
  """Where one tensor lies: file, safetensors dtype name, shape, offsets."""

  def __init__(self, path: str, dtype: str, shape, start: int, end: int):
    self.path, self.dtype, self.shape = path, dtype, tuple(shape)
    self.start, self.end = start, end

  def _dtype(self) -> np.dtype:
    if self.dtype not in DTYPES:
      raise ValueError(f"tensor dtype {self.dtype} is not readable (known: "
                       f"{sorted(DTYPES)})")
    return DTYPES[self.dtype].newbyteorder("<")

  def read(self) -> np.ndarray:
    """The whole tensor."""
    dtype = self._dtype()
    with open(self.path, "rb") as f:
      (header_len,) = struct.unpack("<Q", f.read(8))
      f.seek(8 + header_len + self.start)
      data = f.read(self.end - self.start)
    return np.frombuffer(data, dtype).reshape(self.shape)

  def read_slice(self, index: tuple[slice, ...]) -> np.ndarray:
    """``tensor[index]`` (one slice with unit step per dimension), read
    through a memory map: only the pages that hold the slice are read, and
    only the slice is copied into memory."""
    dtype = self._dtype()
    if len(index) != len(self.shape):
      raise ValueError(f"index {index} does not match the shape "
                       f"{self.shape}")
    if 0 in self.shape:
      return np.zeros(self.shape, dtype)[index]
    with open(self.path, "rb") as f:
      (header_len,) = struct.unpack("<Q", f.read(8))
    data = np.memmap(self.path, dtype=dtype, mode="r",
                     offset=8 + header_len + self.start, shape=self.shape)
    try:
      return np.array(data[index])
    finally:
      del data


def read_header(path: str) -> dict[str, TensorInfo]:
  """The tensors of one ``.safetensors`` file (nothing is read but the
  header)."""
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) != 8:
      raise ValueError(f"{path} is not a safetensors file (shorter than 8 "
                       "bytes)")
    (header_len,) = struct.unpack("<Q", head)
    size = os.path.getsize(path)
    if header_len > size - 8:
      raise ValueError(f"{path} is not a safetensors file (header length "
                       f"{header_len} > file size {size})")
    header = json.loads(f.read(header_len))
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    start, end = info["data_offsets"]
    out[name] = TensorInfo(path, info["dtype"], info["shape"], start, end)
  return out


def checkpoint_tensors(directory: str) -> dict[str, TensorInfo]:
  """Every tensor of a HuggingFace checkpoint directory.

  Reads ``model.safetensors.index.json`` when present (sharded), else
  ``model.safetensors``, else every ``*.safetensors`` file. Raises
  ``ValueError`` when there is none (``pytorch_model.bin`` is not read: it
  is a pickle that needs torch).
  """
  index = os.path.join(directory, INDEX_FILE)
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    files = sorted(set(weight_map.values()))
  elif os.path.exists(os.path.join(directory, SINGLE_FILE)):
    files, weight_map = [SINGLE_FILE], None
  else:
    files = sorted(n for n in os.listdir(directory)
                   if n.endswith(".safetensors"))
    weight_map = None
  if not files:
    found = sorted(os.listdir(directory))
    raise ValueError(f"no safetensors weights in {directory} (found {found}); "
                     "save the model with save_pretrained(..., "
                     "safe_serialization=True)")
  out = {}
  for name in files:
    path = os.path.join(directory, name)
    if not os.path.exists(path):
      raise ValueError(f"{INDEX_FILE} names {name}, which is missing from "
                       f"{directory}")
    for tensor, info in read_header(path).items():
      if weight_map is not None and weight_map.get(tensor) != name:
        continue
      if tensor in out:
        raise ValueError(f"tensor {tensor!r} is stored twice ({out[tensor].path}"
                         f" and {path})")
      out[tensor] = info
  if weight_map is not None:
    missing = sorted(set(weight_map) - set(out))
    if missing:
      raise ValueError(f"{INDEX_FILE} lists tensors that its files do not "
                       f"hold: {missing[:8]}")
  return out


def write_file(path: str, tensors: dict[str, np.ndarray],
               metadata: dict[str, str] | None = None) -> None:
  """Writes ``tensors`` (numpy arrays, names sorted) as one safetensors
  file."""
  header, offset, blobs = {}, 0, []
  for name in sorted(tensors):
    array = np.ascontiguousarray(tensors[name])
    if array.dtype not in _NAMES:
      raise ValueError(f"tensor {name!r} has dtype {array.dtype}, which "
                       "safetensors cannot hold here")
    data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    header[name] = {"dtype": _NAMES[array.dtype], "shape": list(array.shape),
                    "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
  header["__metadata__"] = dict(metadata or {"format": "pt"})
  encoded = json.dumps(header, separators=(",", ":")).encode()
  encoded += b" " * (-len(encoded) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(encoded)))
    f.write(encoded)
    for data in blobs:
      f.write(data)
