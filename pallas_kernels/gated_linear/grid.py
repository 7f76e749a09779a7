"""Grids and block specs of the TPU sub-chunk sweep kernels.

A program owns one (batch, head, key block, value block). The grid is
``(B, H, KB, VB, N)``: the chunk axis last, sequential ("arbitrary"), one
chunk of ``C`` tokens per step (walked backwards by the reverse sweep).

Every array is named by what its axes are (``Field``): per token rows of a
feature axis, per sub-chunk rows, a state block, the checkpoints; a sum over
key or value columns that programs of different blocks compute in parts
has a leading part axis (``parts``: "k", "v" or "kv"), added up in XLA.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common import compiler
from pallas_kernels.gated_linear import sub_chunk
from pallas_kernels.gated_linear.layout import Layout, Tiles

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Grid:
  """The grid of one kernel: its tiles and how it walks time."""
  tiles: Tiles
  lay: Layout
  reverse: bool = False  # TPU: chunk N - 1 - n at step n

  @property
  def shape(self):
    lay, t = self.lay, self.tiles
    return (lay.batch, lay.heads, t.k_blocks, t.v_blocks,
            lay.t_pad // lay.chunk)

  @property
  def rows(self) -> int:
    """Tokens per block: one chunk."""
    return self.lay.chunk

  def split(self, *index):
    """Grid indices -> ``(b, h, kb, vb, n)`` (``n``: the block of rows)."""
    b, h, kb, vb, n = index
    if self.reverse:
      n = self.lay.t_pad // self.lay.chunk - 1 - n
    return b, h, kb, vb, n

  def parts(self, kind: str) -> int:
    return {"": 1, "k": self.tiles.k_blocks, "v": self.tiles.v_blocks,
            "kv": self.tiles.k_blocks * self.tiles.v_blocks}[kind]

  def _part(self, kind, kb, vb):
    return {"": 0, "k": kb, "v": vb,
            "kv": kb * self.tiles.v_blocks + vb}[kind]

  def _width(self, kind: str) -> tuple[int, int]:
    """``(full width, block width)`` of a feature axis: "k", "v", or a
    fixed width."""
    lay, t = self.lay, self.tiles
    if kind == "k":
      return lay.k_pad, t.block_k
    if kind == "v":
      return lay.v_pad, t.block_v
    return kind, kind

  def _block_of(self, kind, kb, vb):
    return {"k": kb, "v": vb}.get(kind, 0) if isinstance(kind, str) else 0

  def spec(self, field: Field) -> pl.BlockSpec:
    """The block spec of ``field``."""
    lay = self.lay
    full, block = self._width(field.width)
    rows, subs = self.rows, self.rows // lay.sub_chunk
    lead = (None,) if field.parts is not None else ()

    def part(kb, vb):
      return (self._part(field.parts, kb, vb),) if field.parts is not None \
          else ()

    if field.kind == "tokens":                      # [(P,) B, H, T, F]
      def index(*i):
        b, h, kb, vb, n = self.split(*i)
        return part(kb, vb) + (b, h, n, self._block_of(field.width, kb, vb))
      return pl.BlockSpec(lead + (None, None, rows, block), index)
    if field.kind == "sub_chunks":                  # [(P,) B, H, T / c, 1, F]
      def index(*i):
        b, h, kb, vb, n = self.split(*i)
        return part(kb, vb) + (b, h, n, 0,
                               self._block_of(field.width, kb, vb))
      return pl.BlockSpec(lead + (None, None, subs, 1, block), index)
    if field.kind == "doc":                         # [B, T, 1]
      return pl.BlockSpec((None, rows, 1),
                          lambda *i: (self.split(*i)[0], self.split(*i)[4],
                                      0))
    if field.kind == "doc_row":                     # [B, T / c, 1, c]
      return pl.BlockSpec((None, subs, 1, lay.sub_chunk),
                          lambda *i: (self.split(*i)[0], self.split(*i)[4],
                                      0, 0))
    t = self.tiles
    if field.kind == "state":                       # [B, H, V, K]
      def index(*i):
        b, h, kb, vb, _ = self.split(*i)
        return b, h, vb, kb
      return pl.BlockSpec((None, None, t.block_v, t.block_k), index)
    if field.kind == "checkpoints":                 # [B, H, N, V, K]
      def index(*i):
        b, h, kb, vb, n = self.split(*i)
        return b, h, n, vb, kb
      return pl.BlockSpec((None, None, None, t.block_v, t.block_k), index)
    raise ValueError(f"unknown field kind {field.kind!r}")

  def out_shape(self, field: Field, dtype) -> jax.ShapeDtypeStruct:
    lay = self.lay
    full, _ = self._width(field.width)
    lead = (self.parts(field.parts),) if field.parts is not None else ()
    shape = {
        "tokens": (lay.batch, lay.heads, lay.t_pad, full),
        "sub_chunks": (lay.batch, lay.heads, lay.t_pad // lay.sub_chunk, 1,
                       full),
        "state": (lay.batch, lay.heads, lay.v_pad, lay.k_pad),
        "checkpoints": (lay.batch, lay.heads, lay.t_pad // lay.chunk,
                        lay.v_pad, lay.k_pad),
    }[field.kind]
    return jax.ShapeDtypeStruct(lead + shape, dtype)


@dataclasses.dataclass(frozen=True)
class Field:
  """What the axes of a kernel input or output are."""
  kind: str                # "tokens", "sub_chunks", "doc", "doc_row",
                           # "state" or "checkpoints"
  width: str | int = 0     # feature axis: "k", "v" or a fixed width
  parts: str | None = None  # leading part axis: "", "k", "v" or "kv"


INPUTS = {
    "q": Field("tokens", "k"),
    "k": Field("tokens", "k"),
    "gate": Field("tokens", "k"),
    "v": Field("tokens", "v"),
    "do": Field("tokens", "v"),
    "gate_row": Field("sub_chunks", None),
    "doc": Field("doc"),
    "doc_prev": Field("doc"),
    "doc_row": Field("doc_row"),
    "initial_state": Field("state"),
    "d_final": Field("state"),
    "checkpoints": Field("checkpoints"),
}


def _input_field(name: str, lay: Layout) -> Field:
  if name == "gate_row":
    return Field("sub_chunks", lay.sub_chunk)
  return INPUTS[name]


def call(kernel, grid: Grid, arrays, outputs, *, name: str, cost,
         interpret: bool, compiler_params, scratch_shapes=()):
  """``pl.pallas_call`` of ``kernel(*refs, names=...)`` over ``grid``.

  ``arrays``: ``{name: input}``; ``outputs``: ``[(name, Field, dtype)]``;
  ``compiler_params(window_bytes)``: the Mosaic settings, given the
  bytes of one buffer of every block; ``scratch_shapes``: ``[(name,
  memory)]`` (TPU). Returns ``{name: output}``.
  """
  names = list(arrays)
  in_specs = [grid.spec(_input_field(n, grid.lay)) for n in names]
  out_specs = [grid.spec(field) for _, field, _ in outputs]
  out_shape = [grid.out_shape(field, dtype) for _, field, dtype in outputs]
  window_bytes = (sum(compiler.block_bytes(s.block_shape, arrays[n].dtype)
                      for s, n in zip(in_specs, names))
                  + sum(compiler.block_bytes(s.block_shape, o.dtype)
                        for s, o in zip(out_specs, out_shape)))
  all_names = (names + [n for n, _, _ in outputs]
               + [n for n, _ in scratch_shapes])
  outs = pl.pallas_call(
      lambda *refs: kernel(dict(zip(all_names, refs))),
      out_shape=out_shape, grid=grid.shape, in_specs=in_specs,
      out_specs=out_specs,
      scratch_shapes=[memory for _, memory in scratch_shapes],
      compiler_params=compiler_params(window_bytes), cost_estimate=cost,
      interpret=interpret, name=name)(*arrays.values())
  return dict(zip([n for n, _, _ in outputs], outs))


def _gate_parts(spec) -> str:
  """Parts of a term of the log-decays' gradient: a scalar decay sums over
  key channels too."""
  return "kv" if spec.gate == "scalar" else "v"


def _gate_width(spec):
  return 1 if spec.gate == "scalar" else "k"


def forward_outputs(spec, grid: Grid, *, out_dtype, final_state: bool):
  """``o`` (parts over key blocks: float32 unless there is one) and the
  final state."""
  one = grid.tiles.k_blocks == 1
  out = [("o", Field("tokens", "v", "k"), out_dtype if one else _F32)]
  if final_state:
    out.append(("final_state", Field("state"), _F32))
  return out


def dq_outputs(spec, grid: Grid):
  """``dq`` (parts over value blocks), and with a decay ``gate_q`` and the
  checkpoints."""
  out = [("dq", Field("tokens", "k", "v"), _F32)]
  if spec.gate != "none":
    out += [("gate_q", Field("tokens", _gate_width(spec), _gate_parts(spec)),
             _F32),
            ("checkpoints", Field("checkpoints"), _F32)]
  return out


def dkv_outputs(spec, grid: Grid, *, d_initial: bool):
  """``dk`` (parts over value blocks), ``dv`` (parts over key blocks), the
  initial state's gradient, and with a decay the ``GateTerms``."""
  out = [("dk", Field("tokens", "k", "v"), _F32),
         ("dv", Field("tokens", "v", "k"), _F32)]
  if d_initial:
    out.append(("d_initial", Field("state"), _F32))
  for name, per_token, width in sub_chunk.gate_term_outputs(spec):
    kind = "tokens" if per_token else "sub_chunks"
    parts = "v" if name == "gate_k_intra" else _gate_parts(spec)
    out.append((name, Field(kind, width, parts), _F32))
  return out
