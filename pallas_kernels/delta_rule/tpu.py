"""Mosaic (TPU) kernels of the delta rule's chunk sweep.

Grid ``(B, H, V blocks, N)``: one program per (batch, head, block of value
columns) walks the ``N`` chunks along the last grid axis, marked "arbitrary"
(sequential), with its ``[block_v, K]`` float32 state (or state gradient) in
a VMEM scratch buffer that persists across its steps. Each step holds one
chunk: ``(C, K)`` tiles with ``C`` a multiple of 16 rows and ``K``, ``V``
padded to 128 lanes; the ``[C, C]`` scores are one block of their full size.

- ``forward``: outputs, the final state, and (for the backward pass) the
  state entering each chunk, each optional.
- ``backward``: the reverse sweep; the chunk axis is walked backwards by the
  index maps (chunk ``N - 1 - n`` at step ``n``). It reads the entering
  states that ``forward`` recomputed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.delta_rule import chunk_step
from pallas_kernels.delta_rule.layout import Layout

_F32 = jnp.float32
_CHUNK_TERMS = ("w", "u", "q", "scores", "k", "decay")


def _in_specs(names, arrays, lay: Layout, chunk_of):
  """Block specs of the named inputs; the grid is ``(b, h, vb, n)``."""
  out = []
  for name in names:
    rows, width = arrays[name].shape[-2:]
    if name in ("w", "q", "scores", "k", "decay"):
      spec = pl.BlockSpec((None, None, None, rows, width),
                          lambda b, h, vb, n: (b, h, chunk_of(n), 0, 0))
    elif name in ("u", "do"):
      spec = pl.BlockSpec((None, None, None, rows, lay.block_v),
                          lambda b, h, vb, n: (b, h, chunk_of(n), 0, vb))
    elif name == "states":
      spec = pl.BlockSpec((None, None, None, lay.block_v, lay.k_pad),
                          lambda b, h, vb, n: (b, h, chunk_of(n), vb, 0))
    elif name in ("initial_state", "d_final"):
      spec = pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                          lambda b, h, vb, n: (b, h, vb, 0))
    else:
      raise ValueError(f"unknown kernel input {name!r}")
    out.append(spec)
  return out


def _params():
  return pltpu.CompilerParams(
      dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))


def _load_chunk(r) -> chunk_step.Chunk:
  return chunk_step.Chunk(*(r[name][...] for name in _CHUNK_TERMS))


def _forward_kernel(*refs, names, spec, last_chunk):
  r = dict(zip(names, refs))
  n = pl.program_id(3)

  @pl.when(n == 0)
  def _():
    if "initial_state" in r:
      r["state"][...] = r["initial_state"][...]
    else:
      r["state"][...] = jnp.zeros(r["state"].shape, _F32)

  state = r["state"][...]                                       # [V, K]
  if "states" in r:
    r["states"][...] = state
  o, state = chunk_step.forward(_load_chunk(r), state, spec,
                                outputs="o" in r)
  if o is not None:
    r["o"][...] = o.astype(r["o"].dtype)                        # [C, V]
  r["state"][...] = state
  if "final_state" in r:
    @pl.when(n == last_chunk)
    def _():
      r["final_state"][...] = state


def forward(arrays, spec, lay: Layout, *, out_dtype, outputs: bool,
            final_state: bool, states: bool, interpret: bool = False):
  """``(o [B, H, N, C_pad, V_pad] or None, final state [B, H, V_pad, K_pad]
  or None, entering states [B, H, N, V_pad, K_pad] or None)``."""
  names = list(arrays)
  b, h, n_chunks = lay.batch, lay.heads, lay.chunks
  wanted = []
  if outputs:
    wanted.append(("o", jax.ShapeDtypeStruct(
        (b, h, n_chunks, lay.c_pad, lay.v_pad), out_dtype),
                   pl.BlockSpec((None, None, None, lay.c_pad, lay.block_v),
                                lambda b, h, vb, n: (b, h, n, 0, vb))))
  if final_state:
    wanted.append(("final_state", jax.ShapeDtypeStruct(
        (b, h, lay.v_pad, lay.k_pad), _F32),
                   pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                                lambda b, h, vb, n: (b, h, vb, 0))))
  if states:
    wanted.append(("states", jax.ShapeDtypeStruct(
        (b, h, n_chunks, lay.v_pad, lay.k_pad), _F32),
                   pl.BlockSpec((None, None, None, lay.block_v, lay.k_pad),
                                lambda b, h, vb, n: (b, h, n, vb, 0))))
  out_names = [name for name, _, _ in wanted]
  kernel = functools.partial(
      _forward_kernel, names=names + out_names + ["state"], spec=spec,
      last_chunk=n_chunks - 1)
  outs = pl.pallas_call(
      kernel, out_shape=[shape for _, shape, _ in wanted],
      grid=(b, h, lay.v_blocks, n_chunks),
      in_specs=_in_specs(names, arrays, lay, lambda n: n),
      out_specs=[block for _, _, block in wanted],
      scratch_shapes=[pltpu.VMEM((lay.block_v, lay.k_pad), _F32)],
      compiler_params=_params(), interpret=interpret,
      name="delta_rule_forward" if outputs else "delta_rule_states",
  )(*arrays.values())
  found = dict(zip(out_names, outs))
  return found.get("o"), found.get("final_state"), found.get("states")


def _backward_kernel(*refs, names, spec, last_step):
  r = dict(zip(names, refs))
  n = pl.program_id(3)

  @pl.when(n == 0)
  def _():
    if "d_final" in r:
      r["d_state"][...] = r["d_final"][...]
    else:
      r["d_state"][...] = jnp.zeros(r["d_state"].shape, _F32)

  grads, d_state = chunk_step.backward(
      _load_chunk(r), r["do"][...], r["states"][...], r["d_state"][...], spec)
  for name, grad in zip(chunk_step.ChunkGrads._fields, grads):
    r["d_" + name][...] = grad
  r["d_state"][...] = d_state
  if "d_initial" in r:
    @pl.when(n == last_step)
    def _():
      r["d_initial"][...] = d_state


def backward(arrays, spec, lay: Layout, *, d_initial: bool,
             interpret: bool = False):
  """The reverse sweep: ``({name: gradient}, d_initial [B, H, V_pad, K_pad]
  or None)``, float32.

  The gradients of ``w, q, scores, k, decay`` are ``[B, H, V blocks, N,
  rows, width]``, one part per block of value columns (to be summed); that of
  ``u`` is ``[B, H, N, C_pad, V_pad]``.
  """
  names = list(arrays)
  b, h, n_chunks, vbs = lay.batch, lay.heads, lay.chunks, lay.v_blocks
  backwards = lambda n: n_chunks - 1 - n  # noqa: E731
  out_names, out_shape, out_specs = [], [], []
  for name in chunk_step.ChunkGrads._fields:
    rows, width = arrays[name].shape[-2:]
    out_names.append("d_" + name)
    if name == "u":
      out_shape.append(jax.ShapeDtypeStruct(
          (b, h, n_chunks, rows, lay.v_pad), _F32))
      out_specs.append(pl.BlockSpec(
          (None, None, None, rows, lay.block_v),
          lambda b, h, vb, n: (b, h, backwards(n), 0, vb)))
    else:
      out_shape.append(jax.ShapeDtypeStruct(
          (b, h, vbs, n_chunks, rows, width), _F32))
      out_specs.append(pl.BlockSpec(
          (None, None, None, None, rows, width),
          lambda b, h, vb, n: (b, h, vb, backwards(n), 0, 0)))
  if d_initial:
    out_names.append("d_initial")
    out_shape.append(jax.ShapeDtypeStruct((b, h, lay.v_pad, lay.k_pad), _F32))
    out_specs.append(pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                                  lambda b, h, vb, n: (b, h, vb, 0)))
  kernel = functools.partial(
      _backward_kernel, names=names + out_names + ["d_state"], spec=spec,
      last_step=n_chunks - 1)
  outs = pl.pallas_call(
      kernel, out_shape=out_shape, grid=(b, h, vbs, n_chunks),
      in_specs=_in_specs(names, arrays, lay, backwards),
      out_specs=out_specs,
      scratch_shapes=[pltpu.VMEM((lay.block_v, lay.k_pad), _F32)],
      compiler_params=_params(), interpret=interpret,
      name="delta_rule_backward")(*arrays.values())
  found = dict(zip(out_names, outs))
  d_init = found.pop("d_initial", None)
  return {name[2:]: grad for name, grad in found.items()}, d_init
