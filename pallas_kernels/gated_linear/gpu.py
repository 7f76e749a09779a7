"""Triton (GPU) kernels of the chunked gated-linear recurrence.

Triton programs run independently and have no scratch memory, so each
program owns one (batch, head, key block, value block) for the whole
sequence (grid ``(B, H, KB * VB)``, ``grid.py``): it walks the sub-chunks in
a ``fori_loop`` with its ``[block_v, block_k]`` float32 state in registers
as the loop carry. Blocks are small enough that the state, its gradient and
a sub-chunk's values fit in registers without spilling (``BlockSizes``
defaults; ``make compile-check`` checks them). Tiles have power-of-two sizes
(``K``, ``V`` padded to a power of two >= 16, sub-chunks of 16 rows or more
for ``tl.dot``).

- ``forward``: outputs (parts over key blocks) and the final state.
- ``dq``: the forward sweep of the backward pass (recomputes the states and,
  with a decay, writes the state entering each chunk as a checkpoint).
- ``dkv``: the reverse sweep, one sub-chunk per loop step. With a decay it
  recomputes the state entering each sub-chunk from its chunk's checkpoint,
  for the log-decays' gradient: ``s`` state updates (an inner loop) for
  sub-chunk ``s`` of a chunk, since registers hold one state at a time.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import compiler
from pallas_kernels.gated_linear import grid as grids
from pallas_kernels.gated_linear import sub_chunk
from pallas_kernels.gated_linear.block_sizes import BlockSizes
from pallas_kernels.gated_linear.layout import Layout

_F32 = jnp.float32


def _call(kernel, grid, arrays, outputs, blocks: BlockSizes, *, name, cost,
          interpret):
  params = compiler.gpu_params(blocks.num_warps, blocks.num_stages)
  return grids.call(kernel, grid, arrays, outputs, name=name, cost=cost,
                    interpret=interpret, compiler_params=lambda _: params)


def _initial(r, name, tiles):
  return (r[name][...] if name in r
          else jnp.zeros((tiles.block_v, tiles.block_k), _F32))


def _forward_kernel(r, *, spec, n_sub, tiles):
  c = spec.sub_chunk

  def body(i, state):
    start = pl.multiple_of(i * c, c)
    o, state = sub_chunk.forward_step(r, spec, start, i, state)
    r["o"][pl.ds(start, c), :] = o.astype(r["o"].dtype)
    return state

  state = lax.fori_loop(0, n_sub, body, _initial(r, "initial_state", tiles))
  if "final_state" in r:
    r["final_state"][...] = state


def forward(arrays, spec, lay: Layout, blocks: BlockSizes, *, out_dtype,
            final_state: bool, cost, interpret: bool = False):
  """As ``tpu.forward``."""
  grid = grids.Grid("gpu", lay.forward, lay)
  outputs = grids.forward_outputs(spec, grid, out_dtype=out_dtype,
                                  final_state=final_state)
  kernel = functools.partial(_forward_kernel, spec=spec,
                             n_sub=lay.t_pad // lay.sub_chunk,
                             tiles=lay.forward)
  return _call(kernel, grid, arrays, outputs, blocks,
               name="gated_linear_forward", cost=cost, interpret=interpret)


def _dq_kernel(r, *, spec, n_sub, subs, tiles):
  c = spec.sub_chunk

  def body(i, state):
    if "checkpoints" in r:
      @pl.when(lax.rem(i, subs) == 0)
      def _():
        r["checkpoints"][lax.div(i, subs)] = state              # [V, K]

    start = pl.multiple_of(i * c, c)
    dq, gate_q, state = sub_chunk.dq_step(r, spec, start, i, state)
    r["dq"][pl.ds(start, c), :] = dq
    if "gate_q" in r:
      r["gate_q"][pl.ds(start, c), :] = gate_q
    return state

  lax.fori_loop(0, n_sub, body, _initial(r, "initial_state", tiles))


def dq(arrays, spec, lay: Layout, blocks: BlockSizes, *, cost,
       interpret: bool = False):
  """As ``tpu.dq``."""
  grid = grids.Grid("gpu", lay.backward, lay)
  kernel = functools.partial(_dq_kernel, spec=spec,
                             n_sub=lay.t_pad // lay.sub_chunk,
                             subs=lay.chunk // lay.sub_chunk,
                             tiles=lay.backward)
  return _call(kernel, grid, arrays, grids.dq_outputs(spec, grid), blocks,
               name="gated_linear_dq", cost=cost, interpret=interpret)


def _dkv_kernel(r, *, spec, n_sub, subs, tiles):
  c = spec.sub_chunk

  def body(i, d_state):
    index = n_sub - 1 - i
    state_in = None
    if "checkpoints" in r:
      # The state entering the sub-chunk, recomputed from its chunk's entry
      # (registers hold one state at a time, so each sub-chunk starts over).
      first = index - lax.rem(index, subs)

      def advance(j, state):
        start = pl.multiple_of(j * c, c)
        return sub_chunk.advance_from(r, spec, start, j, state)

      state_in = lax.fori_loop(first, index, advance,
                               r["checkpoints"][lax.div(index, subs)])
    start = pl.multiple_of(index * c, c)
    dk, dv, d_state, terms = sub_chunk.dkv_step(r, spec, start, index,
                                                d_state, state_in)
    r["dk"][pl.ds(start, c), :] = dk
    r["dv"][pl.ds(start, c), :] = dv
    if terms is not None:
      sub_chunk.store_gate_terms(r, terms, start, index, spec)
    return d_state

  d_state = lax.fori_loop(0, n_sub, body, _initial(r, "d_final", tiles))
  if "d_initial" in r:
    r["d_initial"][...] = d_state


def dkv(arrays, spec, lay: Layout, blocks: BlockSizes, *, d_initial: bool,
        cost, interpret: bool = False):
  """As ``tpu.dkv``."""
  grid = grids.Grid("gpu", lay.backward, lay)
  kernel = functools.partial(_dkv_kernel, spec=spec,
                             n_sub=lay.t_pad // lay.sub_chunk,
                             subs=lay.chunk // lay.sub_chunk,
                             tiles=lay.backward)
  return _call(kernel, grid, arrays,
               grids.dkv_outputs(spec, grid, d_initial=d_initial), blocks,
               name="gated_linear_dkv", cost=cost, interpret=interpret)
