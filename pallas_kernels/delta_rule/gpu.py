"""Triton (GPU) kernels of the delta rule's chunk sweep.

Triton programs run independently and have no scratch memory, so each
program owns one (batch, head, block of value columns) for the whole
sequence: grid ``(B, H, V blocks)``, a ``fori_loop`` over the chunks with
the ``[block_v, K]`` float32 state (or state gradient) in registers as the
loop carry as a tuple of ``[block_v, block_k]`` blocks of key columns,
reading chunk ``n`` of each input as ``ref[n]`` (a term with key columns one
block at a time). Tiles have power-of-two sizes (chunk rows, ``K`` and
``V`` padded to a power of two >= 16, as ``tl.dot`` needs).

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

from pallas_kernels.common import compiler
from pallas_kernels.delta_rule import chunk_step
from pallas_kernels.delta_rule.block_sizes import BlockSizes
from pallas_kernels.delta_rule.layout import Layout
from pallas_kernels.delta_rule.tpu import tile

_F32 = jnp.float32


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


def _key_block(lay: Layout, kb):
  return pl.ds(kb * lay.block_k, lay.block_k)


def _read_blocks(ref, lay: Layout, *index):
  """``ref[*index]``, a ``[V, K]`` state, as ``[V, block_k]`` blocks."""
  return tuple(ref[(*index, slice(None), _key_block(lay, kb))]
               for kb in range(lay.k_blocks))


def _write_blocks(ref, blocks, lay: Layout, *index):
  for kb, block in enumerate(blocks):
    ref[(*index, slice(None), _key_block(lay, kb))] = block


def _initial(r, name, lay: Layout):
  if name in r:
    return _read_blocks(r[name], lay)
  return tuple(jnp.zeros((lay.block_v, lay.block_k), _F32)
               for _ in range(lay.k_blocks))


def _loader(r, lay: Layout, n):
  return lambda name, rb, cb: r[name][(n, *tile(lay, name, rb, cb))]


def _call(kernel, names, arrays, lay, blocks, outputs, *, name, cost,
          interpret):
  return pl.pallas_call(
      kernel, out_shape=[shape for _, shape, _ in outputs],
      grid=(lay.batch, lay.heads, lay.v_blocks),
      in_specs=_in_specs(names, arrays, lay),
      out_specs=[spec for _, _, spec in outputs],
      compiler_params=compiler.gpu_params(blocks.num_warps, blocks.num_stages),
      cost_estimate=cost, interpret=interpret, name=name,
  )(*arrays.values())


def _forward_kernel(*refs, names, spec, lay):
  r = dict(zip(names, refs))

  def body(n, state):
    if "states" in r:
      _write_blocks(r["states"], state, lay, n)
    o, state = chunk_step.forward(_loader(r, lay, n), state, spec,
                                  lay.c_blocks, outputs="o" in r)
    if o is not None:
      for rb, o_r in enumerate(o):
        r["o"][(n, *tile(lay, "o", rb, None))] = o_r.astype(r["o"].dtype)
    return state

  state = lax.fori_loop(0, lay.chunks, body, _initial(r, "initial_state", lay))
  if "final_state" in r:
    _write_blocks(r["final_state"], state, lay)


def forward(arrays, spec, lay: Layout, blocks: BlockSizes, *, out_dtype,
            outputs: bool, final_state: bool, states: bool, cost,
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
  kernel = functools.partial(_forward_kernel, names=names + out_names,
                             spec=spec, lay=lay)
  outs = _call(kernel, names, arrays, lay, blocks, wanted,
               name="delta_rule_forward" if outputs else "delta_rule_states",
               cost=cost, interpret=interpret)
  found = dict(zip(out_names, outs))
  return found.get("o"), found.get("final_state"), found.get("states")


def _backward_kernel(*refs, names, spec, lay):
  r = dict(zip(names, refs))

  def body(i, d_state):
    n = lay.chunks - 1 - i

    def store(name, rb, cb, grad):
      r["d_" + name][(n, *tile(lay, name, rb, cb))] = grad

    return chunk_step.backward(_loader(r, lay, n),
                               _read_blocks(r["states"], lay, n), d_state,
                               spec, lay.c_blocks, store)

  d_state = lax.fori_loop(0, lay.chunks, body, _initial(r, "d_final", lay))
  if "d_initial" in r:
    _write_blocks(r["d_initial"], d_state, lay)


def backward(arrays, spec, lay: Layout, blocks: BlockSizes, *,
             d_initial: bool, cost, interpret: bool = False):
  """The reverse sweep: ``({name: gradient}, d_initial [B, H, V_pad, K_pad]
  or None)``, float32.

  The gradients of ``w, q, scores, k, decay`` are ``[B, H, V blocks, N,
  rows, width]``, one part per block of value columns (to be summed); that of
  ``u`` is ``[B, H, N, C_pad, V_pad]``.
  """
  names = list(arrays)
  b, h, n_chunks, vbs = lay.batch, lay.heads, lay.chunks, lay.v_blocks
  wanted = []
  for name in chunk_step.GRAD_NAMES:
    rows, width = arrays[name].shape[-2:]
    if name == "u":
      wanted.append(("d_u", jax.ShapeDtypeStruct(
          (b, h, n_chunks, rows, lay.v_pad), _F32), pl.BlockSpec(
              (None, None, n_chunks, rows, lay.block_v),
              lambda b, h, vb: (b, h, 0, 0, vb))))
    else:
      wanted.append(("d_" + name, jax.ShapeDtypeStruct(
          (b, h, vbs, n_chunks, rows, width), _F32), pl.BlockSpec(
              (None, None, None, n_chunks, rows, width),
              lambda b, h, vb: (b, h, vb, 0, 0, 0))))
  if d_initial:
    wanted.append(("d_initial", jax.ShapeDtypeStruct(
        (b, h, lay.v_pad, lay.k_pad), _F32), pl.BlockSpec(
            (None, None, lay.block_v, lay.k_pad),
            lambda b, h, vb: (b, h, vb, 0))))
  out_names = [name for name, _, _ in wanted]
  kernel = functools.partial(_backward_kernel, names=names + out_names,
                             spec=spec, lay=lay)
  outs = _call(kernel, names, arrays, lay, blocks, wanted,
               name="delta_rule_backward", cost=cost, interpret=interpret)
  found = dict(zip(out_names, outs))
  d_init = found.pop("d_initial", None)
  return {name[2:]: grad for name, grad in found.items()}, d_init
