"""Triton (GPU) kernel of the delta rule's chunk sweep.

Triton programs run independently and have no scratch memory, so each
program owns one (batch, head, block of value columns) for the whole
sequence: grid ``(B, H, V blocks)``, a ``fori_loop`` over the chunks (from
the last one in the backward sweep) with the ``[block_v, K]`` float32
carried state in registers as the loop carry, a tuple of ``[block_v,
block_k]`` blocks of key columns, reading chunk ``n`` of each input as
``ref[n]`` (inputs with key columns one block at a time). Tiles have
power-of-two sizes (chunk rows, ``K`` and ``V`` padded to a power of two
>= 16, as ``tl.dot`` needs).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import compiler
from pallas_kernels.delta_rule import chunk_step
from pallas_kernels.delta_rule.block_sizes import BlockSizes
from pallas_kernels.delta_rule.layout import Layout

_F32 = jnp.float32


def _in_specs(names, arrays, lay: Layout):
  """Whole-sequence blocks; the grid is ``(b, h, vb)``."""
  out = []
  for name in names:
    rows, width = arrays[name].shape[-2:]
    n = lay.chunks
    if name in chunk_step.KEY_INPUTS:
      spec = pl.BlockSpec((None, None, n, rows, width),
                          lambda b, h, vb: (b, h, 0, 0, 0))
    elif name in chunk_step.VALUE_INPUTS:
      spec = pl.BlockSpec((None, None, n, rows, lay.block_v),
                          lambda b, h, vb: (b, h, 0, 0, vb))
    elif name == "initial_state":
      spec = pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                          lambda b, h, vb: (b, h, vb, 0))
    else:
      raise ValueError(f"unknown kernel input {name!r}")
    out.append(spec)
  return out


def _key_block(lay: Layout, kb):
  return pl.ds(kb * lay.block_k, lay.block_k)


def _read_blocks(ref, lay: Layout, *index):
  """``ref[*index]``, a ``[V, K]`` state, as ``[V, block_k]`` blocks."""
  return tuple(ref[(*index, slice(None), _key_block(lay, kb))]
               for kb in range(lay.k_blocks))


def _write_blocks(ref, blocks, lay: Layout, *index):
  for kb, block in enumerate(blocks):
    ref[(*index, slice(None), _key_block(lay, kb))] = block


def _loader(r, lay: Layout, n):
  def load(name, kb):
    if kb is None:
      return r[name][n]
    return r[name][n, :, _key_block(lay, kb)]
  return load


def _kernel(*refs, names, spec, lay, reverse):
  r = dict(zip(names, refs))

  def body(i, state):
    n = lay.chunks - 1 - i if reverse else i
    _write_blocks(r["states"], state, lay, n)
    y, state = chunk_step.step(_loader(r, lay, n), state, spec)
    r["y"][n] = y                                               # [C, V]
    return state

  if "initial_state" in r:
    state = _read_blocks(r["initial_state"], lay)
  else:
    state = tuple(jnp.zeros((lay.block_v, lay.block_k), _F32)
                  for _ in range(lay.k_blocks))
  state = lax.fori_loop(0, lay.chunks, body, state)
  if "final_state" in r:
    _write_blocks(r["final_state"], state, lay)


def sweep(arrays, spec, lay: Layout, blocks: BlockSizes, *, reverse: bool,
          final_state: bool, name: str, cost, interpret: bool = False):
  """As ``tpu.sweep``: ``(y [B, H, N, C_pad, V_pad], x entering each chunk
  [B, H, N, V_pad, K_pad], final [B, H, V_pad, K_pad] or None)``,
  float32."""
  names = list(arrays)
  b, h, n_chunks = lay.batch, lay.heads, lay.chunks
  outputs = [
      ("y", jax.ShapeDtypeStruct((b, h, n_chunks, lay.c_pad, lay.v_pad),
                                 _F32),
       pl.BlockSpec((None, None, n_chunks, lay.c_pad, lay.block_v),
                    lambda b, h, vb: (b, h, 0, 0, vb))),
      ("states", jax.ShapeDtypeStruct((b, h, n_chunks, lay.v_pad, lay.k_pad),
                                      _F32),
       pl.BlockSpec((None, None, n_chunks, lay.block_v, lay.k_pad),
                    lambda b, h, vb: (b, h, 0, vb, 0)))]
  if final_state:
    outputs.append(
        ("final_state", jax.ShapeDtypeStruct((b, h, lay.v_pad, lay.k_pad),
                                             _F32),
         pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                      lambda b, h, vb: (b, h, vb, 0))))
  kernel = functools.partial(
      _kernel, names=names + [o[0] for o in outputs], spec=spec, lay=lay,
      reverse=reverse)
  outs = pl.pallas_call(
      kernel, out_shape=[shape for _, shape, _ in outputs],
      grid=(b, h, lay.v_blocks),
      in_specs=_in_specs(names, arrays, lay),
      out_specs=[s for _, _, s in outputs],
      compiler_params=compiler.gpu_params(blocks.num_warps, blocks.num_stages),
      cost_estimate=cost, interpret=interpret, name=name,
  )(*arrays.values())
  return outs[0], outs[1], (outs[2] if final_state else None)
