"""Mosaic (TPU) kernels of the chunked gated-linear recurrence.

Grid ``(B, H, KB, VB, N)`` (``grid.py``): one program per (batch, head, key
block, value block) walks the ``N`` chunks along the last grid axis, marked
"arbitrary" (sequential), with its ``[block_v, block_k]`` float32 state in a
VMEM scratch buffer that persists across its steps. Each step holds one
chunk (``(C, F)`` tiles: ``C`` a multiple of 16 rows, feature blocks whole
128-lane tiles) and runs its sub-chunks in an unrolled loop (static offsets,
no dynamic sublane slicing), reading the state from VMEM and writing it back
after every sub-chunk (so no state value lives across sub-chunks).

- ``forward``: outputs (parts over key blocks) and the final state.
- ``dq``: the forward sweep of the backward pass (recomputes the states and,
  with a decay, writes the state entering each chunk as a checkpoint).
- ``dkv``: the reverse sweep; the chunk axis is walked backwards by the
  index maps. With a decay it recomputes the state entering each sub-chunk
  from the chunk's checkpoint into a VMEM scratch buffer, for the
  log-decays' gradient.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common import compiler
from pallas_kernels.gated_linear import grid as grids
from pallas_kernels.gated_linear import sub_chunk
from pallas_kernels.gated_linear.layout import Layout

_F32 = jnp.float32


def _params(window_bytes, scratch):
  return compiler.tpu_params(
      4, window_bytes=window_bytes,
      scratch_bytes=sum(compiler.nbytes(m.shape, _F32) for _, m in scratch))


def _call(kernel, grid, arrays, outputs, scratch, *, name, cost, interpret):
  return grids.call(kernel, grid, arrays, outputs, name=name, cost=cost,
                    interpret=interpret, scratch_shapes=scratch,
                    compiler_params=functools.partial(_params,
                                                      scratch=scratch))


def _start(r, name, initial):
  """At the first step: the scratch ``name`` from input ``initial`` (or
  zeros)."""
  @pl.when(pl.program_id(4) == 0)
  def _():
    if initial in r:
      r[name][...] = r[initial][...]
    else:
      r[name][...] = jnp.zeros(r[name].shape, _F32)


def _forward_kernel(r, *, spec, subs, last_step):
  _start(r, "state", "initial_state")
  c = spec.sub_chunk
  for s in range(subs):
    o, state = sub_chunk.forward_step(r, spec, s * c, s, r["state"][...])
    r["o"][pl.ds(s * c, c), :] = o.astype(r["o"].dtype)         # [c, V]
    r["state"][...] = state                                     # [V, K]
  if "final_state" in r:
    @pl.when(pl.program_id(4) == last_step)
    def _():
      r["final_state"][...] = r["state"][...]


def forward(arrays, spec, lay: Layout, *, out_dtype, final_state: bool,
            cost, interpret: bool = False):
  """``{"o": [KB, B, H, T_pad, V_pad], "final_state": [B, H, V_pad, K_pad]}``
  (parts of ``o`` over key blocks)."""
  grid = grids.Grid(lay.forward, lay)
  outputs = grids.forward_outputs(spec, grid, out_dtype=out_dtype,
                                  final_state=final_state)
  kernel = functools.partial(_forward_kernel, spec=spec,
                             subs=lay.chunk // lay.sub_chunk,
                             last_step=grid.shape[-1] - 1)
  scratch = [("state", pltpu.VMEM((lay.forward.block_v,
                                   lay.forward.block_k), _F32))]
  return _call(kernel, grid, arrays, outputs, scratch,
               name="gated_linear_forward", cost=cost, interpret=interpret)


def _dq_kernel(r, *, spec, subs):
  _start(r, "state", "initial_state")
  if "checkpoints" in r:
    r["checkpoints"][...] = r["state"][...]
  c = spec.sub_chunk
  for s in range(subs):
    dq, gate_q, state = sub_chunk.dq_step(r, spec, s * c, s, r["state"][...])
    r["dq"][pl.ds(s * c, c), :] = dq
    if "gate_q" in r:
      r["gate_q"][pl.ds(s * c, c), :] = gate_q
    r["state"][...] = state


def dq(arrays, spec, lay: Layout, *, cost, interpret: bool = False):
  """``{"dq": [VB, B, H, T_pad, K_pad]`` (the query scale included), and
  with a decay ``"gate_q"`` (the forward sweep's terms of the log-decays'
  gradient, ``sub_chunk.dq_step``) and ``"checkpoints" [B, H, N, V_pad,
  K_pad]`` (the state entering each chunk)``}``; float32, parts over value
  blocks (and key blocks for a scalar decay's ``gate_q``)."""
  grid = grids.Grid(lay.backward, lay)
  kernel = functools.partial(_dq_kernel, spec=spec,
                             subs=lay.chunk // lay.sub_chunk)
  scratch = [("state", pltpu.VMEM((lay.backward.block_v,
                                   lay.backward.block_k), _F32))]
  return _call(kernel, grid, arrays, grids.dq_outputs(spec, grid), scratch,
               name="gated_linear_dq", cost=cost, interpret=interpret)


def _dkv_kernel(r, *, spec, subs, last_step):
  _start(r, "d_state", "d_final")
  c = spec.sub_chunk
  if "checkpoints" in r:
    # The state entering each sub-chunk, recomputed from the chunk's entry.
    r["entry_states"][0] = r["checkpoints"][...]
    for s in range(subs - 1):
      r["entry_states"][s + 1] = sub_chunk.advance_from(
          r, spec, s * c, s, r["entry_states"][s])
  for s in reversed(range(subs)):
    state_in = r["entry_states"][s] if "checkpoints" in r else None
    dk, dv, d_state, terms = sub_chunk.dkv_step(r, spec, s * c, s,
                                                r["d_state"][...], state_in)
    r["dk"][pl.ds(s * c, c), :] = dk
    r["dv"][pl.ds(s * c, c), :] = dv
    if terms is not None:
      sub_chunk.store_gate_terms(r, terms, s * c, s, spec)
    r["d_state"][...] = d_state
  if "d_initial" in r:
    @pl.when(pl.program_id(4) == last_step)
    def _():
      r["d_initial"][...] = r["d_state"][...]


def dkv(arrays, spec, lay: Layout, *, d_initial: bool, cost,
        interpret: bool = False):
  """``{"dk": [VB, B, H, T_pad, K_pad], "dv": [KB, B, H, T_pad, V_pad],
  "d_initial": [B, H, V_pad, K_pad]}`` and with a decay the gate terms of
  ``sub_chunk.gate_term_outputs``; float32, walking the chunks backwards.
  With a decay, ``arrays`` holds the ``checkpoints`` of ``dq``."""
  grid = grids.Grid(lay.backward, lay, reverse=True)
  tiles = lay.backward
  subs = lay.chunk // lay.sub_chunk
  scratch = [("d_state", pltpu.VMEM((tiles.block_v, tiles.block_k), _F32))]
  if "checkpoints" in arrays:
    scratch.append(("entry_states", pltpu.VMEM(
        (subs, tiles.block_v, tiles.block_k), _F32)))
  kernel = functools.partial(_dkv_kernel, spec=spec, subs=subs,
                             last_step=grid.shape[-1] - 1)
  return _call(kernel, grid, arrays,
               grids.dkv_outputs(spec, grid, d_initial=d_initial), scratch,
               name="gated_linear_dkv", cost=cost, interpret=interpret)
