"""Triton (GPU) kernels of the delta rule's chunk sweep.

Triton programs run independently and have no scratch memory, so each
program owns one (batch, head, block of value columns) for the whole
sequence: grid ``(B, H, V blocks)``, a ``fori_loop`` over the chunks with
the ``[block_v, K]`` float32 state (or state gradient) in registers as the
loop carry, reading chunk ``n`` of each input as ``ref[n]``. Tiles have
power-of-two sizes (chunk rows, ``K`` and ``V`` padded to a power of two
>= 16, as ``tl.dot`` needs).

- ``forward``: outputs, the final state, and (for the backward pass) the
  state entering each chunk, each optional.
- ``backward``: the reverse sweep, from the last chunk to the first,
  reading the entering states that ``forward`` recomputed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.delta_rule import chunk_step
from pallas_kernels.delta_rule.block_sizes import BlockSizes
from pallas_kernels.delta_rule.layout import Layout

_F32 = jnp.float32
_CHUNK_TERMS = ("w", "u", "q", "scores", "k", "decay")


def _in_specs(names, arrays, lay: Layout):
  """Whole-sequence blocks; the grid is ``(b, h, vb)``."""
  out = []
  for name in names:
    rows, width = arrays[name].shape[-2:]
    n = lay.chunks
    if name in ("w", "q", "scores", "k", "decay"):
      spec = pl.BlockSpec((None, None, n, rows, width),
                          lambda b, h, vb: (b, h, 0, 0, 0))
    elif name in ("u", "do"):
      spec = pl.BlockSpec((None, None, n, rows, lay.block_v),
                          lambda b, h, vb: (b, h, 0, 0, vb))
    elif name == "states":
      spec = pl.BlockSpec((None, None, n, lay.block_v, lay.k_pad),
                          lambda b, h, vb: (b, h, 0, vb, 0))
    elif name in ("initial_state", "d_final"):
      spec = pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                          lambda b, h, vb: (b, h, vb, 0))
    else:
      raise ValueError(f"unknown kernel input {name!r}")
    out.append(spec)
  return out


def _params(blocks: BlockSizes):
  return pltriton.CompilerParams(num_warps=blocks.num_warps,
                                 num_stages=blocks.num_stages)


def _initial(r, name, shape):
  return r[name][...] if name in r else jnp.zeros(shape, _F32)


def _load_chunk(r, n) -> chunk_step.Chunk:
  return chunk_step.Chunk(*(r[name][n] for name in _CHUNK_TERMS))


def _forward_kernel(*refs, names, spec, n_chunks, shape):
  r = dict(zip(names, refs))

  def body(n, state):
    if "states" in r:
      r["states"][n] = state
    o, state = chunk_step.forward(_load_chunk(r, n), state, spec,
                                  outputs="o" in r)
    if o is not None:
      r["o"][n] = o.astype(r["o"].dtype)                        # [C, V]
    return state

  state = lax.fori_loop(0, n_chunks, body,
                        _initial(r, "initial_state", shape))    # [V, K]
  if "final_state" in r:
    r["final_state"][...] = state


def forward(arrays, spec, lay: Layout, blocks: BlockSizes, *, out_dtype,
            outputs: bool, final_state: bool, states: bool,
            interpret: bool = False):
  """``(o [B, H, N, C_pad, V_pad] or None, final state [B, H, V_pad, K_pad]
  or None, entering states [B, H, N, V_pad, K_pad] or None)``."""
  names = list(arrays)
  b, h, n_chunks = lay.batch, lay.heads, lay.chunks
  wanted = []
  if outputs:
    wanted.append(("o", jax.ShapeDtypeStruct(
        (b, h, n_chunks, lay.c_pad, lay.v_pad), out_dtype),
                   pl.BlockSpec((None, None, n_chunks, lay.c_pad, lay.block_v),
                                lambda b, h, vb: (b, h, 0, 0, vb))))
  if final_state:
    wanted.append(("final_state", jax.ShapeDtypeStruct(
        (b, h, lay.v_pad, lay.k_pad), _F32),
                   pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                                lambda b, h, vb: (b, h, vb, 0))))
  if states:
    wanted.append(("states", jax.ShapeDtypeStruct(
        (b, h, n_chunks, lay.v_pad, lay.k_pad), _F32),
                   pl.BlockSpec((None, None, n_chunks, lay.block_v, lay.k_pad),
                                lambda b, h, vb: (b, h, 0, vb, 0))))
  out_names = [name for name, _, _ in wanted]
  kernel = functools.partial(
      _forward_kernel, names=names + out_names, spec=spec, n_chunks=n_chunks,
      shape=(lay.block_v, lay.k_pad))
  outs = pl.pallas_call(
      kernel, out_shape=[shape for _, shape, _ in wanted],
      grid=(b, h, lay.v_blocks),
      in_specs=_in_specs(names, arrays, lay),
      out_specs=[block for _, _, block in wanted],
      compiler_params=_params(blocks), interpret=interpret,
      name="delta_rule_forward" if outputs else "delta_rule_states",
  )(*arrays.values())
  found = dict(zip(out_names, outs))
  return found.get("o"), found.get("final_state"), found.get("states")


def _backward_kernel(*refs, names, spec, n_chunks, shape):
  r = dict(zip(names, refs))

  def body(i, d_state):
    n = n_chunks - 1 - i
    grads, d_state = chunk_step.backward(
        _load_chunk(r, n), r["do"][n], r["states"][n], d_state, spec)
    for name, grad in zip(chunk_step.ChunkGrads._fields, grads):
      r["d_" + name][n] = grad
    return d_state

  d_state = lax.fori_loop(0, n_chunks, body,
                          _initial(r, "d_final", shape))        # [V, K]
  if "d_initial" in r:
    r["d_initial"][...] = d_state


def backward(arrays, spec, lay: Layout, blocks: BlockSizes, *,
             d_initial: bool, interpret: bool = False):
  """The reverse sweep: ``({name: gradient}, d_initial [B, H, V_pad, K_pad]
  or None)``, float32.

  The gradients of ``w, q, scores, k, decay`` are ``[B, H, V blocks, N,
  rows, width]``, one part per block of value columns (to be summed); that of
  ``u`` is ``[B, H, N, C_pad, V_pad]``.
  """
  names = list(arrays)
  b, h, n_chunks, vbs = lay.batch, lay.heads, lay.chunks, lay.v_blocks
  out_names, out_shape, out_specs = [], [], []
  for name in chunk_step.ChunkGrads._fields:
    rows, width = arrays[name].shape[-2:]
    out_names.append("d_" + name)
    if name == "u":
      out_shape.append(jax.ShapeDtypeStruct(
          (b, h, n_chunks, rows, lay.v_pad), _F32))
      out_specs.append(pl.BlockSpec((None, None, n_chunks, rows, lay.block_v),
                                    lambda b, h, vb: (b, h, 0, 0, vb)))
    else:
      out_shape.append(jax.ShapeDtypeStruct(
          (b, h, vbs, n_chunks, rows, width), _F32))
      out_specs.append(pl.BlockSpec(
          (None, None, None, n_chunks, rows, width),
          lambda b, h, vb: (b, h, vb, 0, 0, 0)))
  if d_initial:
    out_names.append("d_initial")
    out_shape.append(jax.ShapeDtypeStruct((b, h, lay.v_pad, lay.k_pad), _F32))
    out_specs.append(pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                                  lambda b, h, vb: (b, h, vb, 0)))
  kernel = functools.partial(
      _backward_kernel, names=names + out_names, spec=spec, n_chunks=n_chunks,
      shape=(lay.block_v, lay.k_pad))
  outs = pl.pallas_call(
      kernel, out_shape=out_shape, grid=(b, h, vbs),
      in_specs=_in_specs(names, arrays, lay), out_specs=out_specs,
      compiler_params=_params(blocks), interpret=interpret,
      name="delta_rule_backward")(*arrays.values())
  found = dict(zip(out_names, outs))
  d_init = found.pop("d_initial", None)
  return {name[2:]: grad for name, grad in found.items()}, d_init
