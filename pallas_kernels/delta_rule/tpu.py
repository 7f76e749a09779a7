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

from pallas_kernels.common import compiler
from pallas_kernels.delta_rule import chunk_step
from pallas_kernels.delta_rule.layout import Layout

_F32 = jnp.float32
_KEY_BLOCKED = ("w", "q", "k", "decay")


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


def _key_block(lay: Layout, kb):
  return pl.ds(kb * lay.block_k, lay.block_k)


def tile(lay: Layout, name: str, rb, cb):
  """``(rows, columns)`` of block ``(rb, cb)`` of a chunk term (see
  ``chunk_step.Load``)."""
  rows = slice(None) if rb is None else pl.ds(rb * lay.block_c, lay.block_c)
  if cb is None:
    return rows, slice(None)
  width = lay.block_c if name == "scores" else lay.block_k
  return rows, pl.ds(cb * width, width)


def _blocks(ref, lay: Layout):
  """A ``[V, K]`` state ref as a tuple of ``[V, block_k]`` blocks."""
  return tuple(ref[:, _key_block(lay, kb)] for kb in range(lay.k_blocks))


def _put(ref, blocks, lay: Layout):
  for kb, block in enumerate(blocks):
    ref[:, _key_block(lay, kb)] = block


def _loader(r, lay: Layout):
  return lambda name, rb, cb: r[name][tile(lay, name, rb, cb)]


def _call(kernel, names, arrays, lay, outputs, chunk_of, *, name, cost,
          interpret):
  """``pl.pallas_call`` over ``(B, H, VB, N)``; ``outputs``: ``[(name,
  ShapeDtypeStruct, BlockSpec)]``; a ``[block_v, K]`` float32 scratch."""
  in_specs = _in_specs(names, arrays, lay, chunk_of)
  window_bytes = (
      sum(compiler.block_bytes(s.block_shape, arrays[n].dtype)
          for s, n in zip(in_specs, names))
      + sum(compiler.block_bytes(spec.block_shape, shape.dtype)
            for _, shape, spec in outputs))
  scratch = (lay.block_v, lay.k_pad)
  return pl.pallas_call(
      kernel, out_shape=[shape for _, shape, _ in outputs],
      grid=(lay.batch, lay.heads, lay.v_blocks, lay.chunks),
      in_specs=in_specs, out_specs=[spec for _, _, spec in outputs],
      scratch_shapes=[pltpu.VMEM(scratch, _F32)],
      compiler_params=compiler.tpu_params(
          3, window_bytes=window_bytes,
          scratch_bytes=compiler.nbytes(scratch, _F32)),
      cost_estimate=cost, interpret=interpret, name=name,
  )(*arrays.values())


def _forward_kernel(*refs, names, spec, lay, last_chunk):
  r = dict(zip(names, refs))
  n = pl.program_id(3)

  @pl.when(n == 0)
  def _():
    if "initial_state" in r:
      r["state"][...] = r["initial_state"][...]
    else:
      r["state"][...] = jnp.zeros(r["state"].shape, _F32)

  if "states" in r:
    r["states"][...] = r["state"][...]
  o, state = chunk_step.forward(_loader(r, lay), _blocks(r["state"], lay),
                                spec, lay.c_blocks, outputs="o" in r)
  if o is not None:
    for rb, o_r in enumerate(o):
      r["o"][tile(lay, "o", rb, None)] = o_r.astype(r["o"].dtype)  # [c, V]
  _put(r["state"], state, lay)
  if "final_state" in r:
    @pl.when(n == last_chunk)
    def _():
      r["final_state"][...] = r["state"][...]


def forward(arrays, spec, lay: Layout, *, out_dtype, outputs: bool,
            final_state: bool, states: bool, cost, interpret: bool = False):
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
      lay=lay, last_chunk=n_chunks - 1)
  outs = _call(kernel, names, arrays, lay, wanted, lambda n: n,
               name="delta_rule_forward" if outputs else "delta_rule_states",
               cost=cost, interpret=interpret)
  found = dict(zip(out_names, outs))
  return found.get("o"), found.get("final_state"), found.get("states")


def _backward_kernel(*refs, names, spec, lay, last_step):
  r = dict(zip(names, refs))
  n = pl.program_id(3)

  @pl.when(n == 0)
  def _():
    if "d_final" in r:
      r["d_state"][...] = r["d_final"][...]
    else:
      r["d_state"][...] = jnp.zeros(r["d_state"].shape, _F32)

  def store(name, rb, cb, grad):
    r["d_" + name][tile(lay, name, rb, cb)] = grad

  d_state = chunk_step.backward(
      _loader(r, lay), _blocks(r["states"], lay), _blocks(r["d_state"], lay),
      spec, lay.c_blocks, store)
  _put(r["d_state"], d_state, lay)
  if "d_initial" in r:
    @pl.when(n == last_step)
    def _():
      r["d_initial"][...] = r["d_state"][...]


def backward(arrays, spec, lay: Layout, *, d_initial: bool, cost,
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
  wanted = []
  for name in chunk_step.GRAD_NAMES:
    rows, width = arrays[name].shape[-2:]
    if name == "u":
      wanted.append(("d_u", jax.ShapeDtypeStruct(
          (b, h, n_chunks, rows, lay.v_pad), _F32), pl.BlockSpec(
              (None, None, None, rows, lay.block_v),
              lambda b, h, vb, n: (b, h, backwards(n), 0, vb))))
    else:
      wanted.append(("d_" + name, jax.ShapeDtypeStruct(
          (b, h, vbs, n_chunks, rows, width), _F32), pl.BlockSpec(
              (None, None, None, None, rows, width),
              lambda b, h, vb, n: (b, h, vb, backwards(n), 0, 0))))
  if d_initial:
    wanted.append(("d_initial", jax.ShapeDtypeStruct(
        (b, h, lay.v_pad, lay.k_pad), _F32), pl.BlockSpec(
            (None, None, lay.block_v, lay.k_pad),
            lambda b, h, vb, n: (b, h, vb, 0))))
  out_names = [name for name, _, _ in wanted]
  kernel = functools.partial(
      _backward_kernel, names=names + out_names + ["d_state"], spec=spec,
      lay=lay, last_step=n_chunks - 1)
  outs = _call(kernel, names, arrays, lay, wanted, backwards,
               name="delta_rule_backward", cost=cost, interpret=interpret)
  found = dict(zip(out_names, outs))
  d_init = found.pop("d_initial", None)
  return {name[2:]: grad for name, grad in found.items()}, d_init
