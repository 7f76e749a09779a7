"""Mosaic (TPU) kernel of the delta rule's chunk sweep.

Grid ``(B, H, V blocks, N)``: one program per (batch, head, block of value
columns) walks the ``N`` chunks along the last grid axis, marked "arbitrary"
(sequential), with its ``[block_v, K]`` float32 carried state in a VMEM
scratch buffer that persists across its steps. Each step holds one chunk:
``[C, K]`` tiles with ``C`` a multiple of 16 rows and ``K``, ``V`` padded to
128 lanes. The backward sweep walks the chunk axis backwards through the
index maps (chunk ``N - 1 - n`` at step ``n``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common import compiler
from pallas_kernels.delta_rule import chunk_step
from pallas_kernels.delta_rule.layout import Layout

_F32 = jnp.float32


def _in_specs(names, arrays, lay: Layout, chunk_of):
  """Block specs of the named inputs; the grid is ``(b, h, vb, n)``."""
  out = []
  for name in names:
    rows, width = arrays[name].shape[-2:]
    if name in chunk_step.KEY_INPUTS:
      spec = pl.BlockSpec((None, None, None, rows, width),
                          lambda b, h, vb, n: (b, h, chunk_of(n), 0, 0))
    elif name in chunk_step.VALUE_INPUTS:
      spec = pl.BlockSpec((None, None, None, rows, lay.block_v),
                          lambda b, h, vb, n: (b, h, chunk_of(n), 0, vb))
    elif name == "initial_state":
      spec = pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                          lambda b, h, vb, n: (b, h, vb, 0))
    else:
      raise ValueError(f"unknown kernel input {name!r}")
    out.append(spec)
  return out


def _key_block(lay: Layout, kb):
  return pl.ds(kb * lay.block_k, lay.block_k)


def _loader(r, lay: Layout):
  def load(name, kb):
    if kb is None:
      return r[name][...]
    return r[name][:, _key_block(lay, kb)]
  return load


def _kernel(*refs, names, spec, lay, last_step):
  r = dict(zip(names, refs))
  n = pl.program_id(3)

  @pl.when(n == 0)
  def _():
    if "initial_state" in r:
      r["state"][...] = r["initial_state"][...]
    else:
      r["state"][...] = jnp.zeros(r["state"].shape, _F32)

  r["states"][...] = r["state"][...]

  def write(kb, x):
    r["state"][:, _key_block(lay, kb)] = x

  r["y"][...] = chunk_step.step(
      _loader(r, lay), lambda kb: r["state"][:, _key_block(lay, kb)], write,
      lay.k_blocks, spec)                                       # [C, V]
  if "final_state" in r:
    @pl.when(n == last_step)
    def _():
      r["final_state"][...] = r["state"][...]


def sweep(arrays, spec, lay: Layout, *, reverse: bool, final_state: bool,
          name: str, cost, interpret: bool = False):
  """``(y [B, H, N, C_pad, V_pad], x entering each chunk [B, H, N, V_pad,
  K_pad], final [B, H, V_pad, K_pad] or None)``, float32; ``arrays``: the
  inputs of ``chunk_step`` by name, plus ``initial_state`` if given."""
  names = list(arrays)
  b, h, n_chunks = lay.batch, lay.heads, lay.chunks
  chunk_of = (lambda n: n_chunks - 1 - n) if reverse else (lambda n: n)
  outputs = [
      ("y", jax.ShapeDtypeStruct((b, h, n_chunks, lay.c_pad, lay.v_pad),
                                 _F32),
       pl.BlockSpec((None, None, None, lay.c_pad, lay.block_v),
                    lambda b, h, vb, n: (b, h, chunk_of(n), 0, vb))),
      ("states", jax.ShapeDtypeStruct((b, h, n_chunks, lay.v_pad, lay.k_pad),
                                      _F32),
       pl.BlockSpec((None, None, None, lay.block_v, lay.k_pad),
                    lambda b, h, vb, n: (b, h, chunk_of(n), vb, 0)))]
  if final_state:
    outputs.append(
        ("final_state", jax.ShapeDtypeStruct((b, h, lay.v_pad, lay.k_pad),
                                             _F32),
         pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                      lambda b, h, vb, n: (b, h, vb, 0))))
  in_specs = _in_specs(names, arrays, lay, chunk_of)
  window_bytes = (
      sum(compiler.block_bytes(s.block_shape, arrays[n].dtype)
          for s, n in zip(in_specs, names))
      + sum(compiler.block_bytes(s.block_shape, shape.dtype)
            for _, shape, s in outputs))
  scratch = (lay.block_v, lay.k_pad)
  kernel = functools.partial(
      _kernel, names=names + [o[0] for o in outputs] + ["state"], spec=spec,
      lay=lay, last_step=n_chunks - 1)
  outs = pl.pallas_call(
      kernel, out_shape=[shape for _, shape, _ in outputs],
      grid=(b, h, lay.v_blocks, n_chunks),
      in_specs=in_specs, out_specs=[s for _, _, s in outputs],
      scratch_shapes=[pltpu.VMEM(scratch, _F32)],
      compiler_params=compiler.tpu_params(
          3, window_bytes=window_bytes,
          scratch_bytes=compiler.nbytes(scratch, _F32)),
      cost_estimate=cost, interpret=interpret, name=name,
  )(*arrays.values())
  return outs[0], outs[1], (outs[2] if final_state else None)
