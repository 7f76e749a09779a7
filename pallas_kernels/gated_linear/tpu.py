"""Mosaic (TPU) kernels of the chunked gated-linear recurrence.

Grid ``(B, H, [V blocks,] N)``: one program per (batch, head) pair walks the
``N`` chunks along the last grid axis, marked "arbitrary" (sequential), with
the ``[V, K]`` float32 state in a VMEM scratch buffer that persists across
its steps. Each step holds one chunk (``(C, K)`` tiles: ``C`` a multiple of
16 rows, ``K`` and ``V`` padded to 128 lanes) and runs its sub-chunks in an
unrolled loop (static offsets, no dynamic sublane slicing).

- ``forward``: outputs and the final state.
- ``dq``: the forward sweep of the backward pass (recomputes the states and,
  with a decay, writes the state entering each chunk as a checkpoint).
- ``dkv``: the reverse sweep; the chunk axis is walked backwards by the
  index maps (chunk ``N - 1 - n`` at step ``n``). With a decay it recomputes
  the state entering each sub-chunk from the chunk's checkpoint into a VMEM
  scratch buffer, for the log-decays' gradient.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.gated_linear import sub_chunk
from pallas_kernels.gated_linear.layout import Layout

_F32 = jnp.float32


def _in_specs(names, arrays, lay: Layout, chunk_of, v_block_of):
  """Block specs for the named inputs; grid indices start with (b, h)."""
  big, subs = lay.chunk, lay.chunk // lay.sub_chunk
  out = []
  for name in names:
    shape = arrays[name].shape
    if name in ("q", "k", "gate", "do"):
      spec = pl.BlockSpec((None, None, big, shape[-1]),
                          lambda b, h, *g: (b, h, chunk_of(*g), 0))
    elif name == "v":
      spec = pl.BlockSpec((None, None, big, lay.block_v),
                          lambda b, h, *g: (b, h, chunk_of(*g), v_block_of(*g)))
    elif name == "gate_row":
      spec = pl.BlockSpec((None, None, subs, 1, lay.sub_chunk),
                          lambda b, h, *g: (b, h, chunk_of(*g), 0, 0))
    elif name in ("doc", "doc_prev"):
      spec = pl.BlockSpec((None, big, 1), lambda b, h, *g: (b, chunk_of(*g), 0))
    elif name == "doc_row":
      spec = pl.BlockSpec((None, subs, 1, lay.sub_chunk),
                          lambda b, h, *g: (b, chunk_of(*g), 0, 0))
    elif name == "initial_state":
      spec = pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                          lambda b, h, *g: (b, h, v_block_of(*g), 0))
    elif name == "checkpoints":
      spec = pl.BlockSpec((None, None, None, lay.v_pad, lay.k_pad),
                          lambda b, h, *g: (b, h, chunk_of(*g), 0, 0))
    elif name == "d_final":
      spec = pl.BlockSpec((None, None, lay.v_pad, lay.k_pad),
                          lambda b, h, *g: (b, h, 0, 0))
    else:
      raise ValueError(f"unknown kernel input {name!r}")
    out.append(spec)
  return out


def _params(parallel_axes: int):
  return pltpu.CompilerParams(
      dimension_semantics=("parallel",) * parallel_axes + ("arbitrary",))


def _forward_kernel(*refs, names, spec, subs, last_chunk):
  r = dict(zip(names, refs))
  n = pl.program_id(3)

  @pl.when(n == 0)
  def _():
    if "initial_state" in r:
      r["state"][...] = r["initial_state"][...]
    else:
      r["state"][...] = jnp.zeros(r["state"].shape, _F32)

  c = spec.sub_chunk
  state = r["state"][...]                                       # [V, K]
  for s in range(subs):
    o, state = sub_chunk.forward_step(r, spec, s * c, s, state)
    r["o"][pl.ds(s * c, c), :] = o.astype(r["o"].dtype)         # [c, V]
  r["state"][...] = state
  if "final_state" in r:
    @pl.when(n == last_chunk)
    def _():
      r["final_state"][...] = state


def forward(arrays, spec, lay: Layout, *, out_dtype, final_state: bool,
            interpret: bool = False):
  """``(o [B, H, T_pad, V_pad], final state [B, H, V_pad, K_pad] or None)``."""
  names = list(arrays)
  b, h, n_chunks = lay.batch, lay.heads, lay.t_pad // lay.chunk
  v_blocks = lay.v_pad // lay.block_v
  in_specs = _in_specs(names, arrays, lay, lambda vb, n: n, lambda vb, n: vb)
  out_shape = [jax.ShapeDtypeStruct((b, h, lay.t_pad, lay.v_pad), out_dtype)]
  out_specs = [pl.BlockSpec((None, None, lay.chunk, lay.block_v),
                            lambda b, h, vb, n: (b, h, n, vb))]
  out_names = ["o"]
  if final_state:
    out_shape.append(jax.ShapeDtypeStruct((b, h, lay.v_pad, lay.k_pad), _F32))
    out_specs.append(pl.BlockSpec((None, None, lay.block_v, lay.k_pad),
                                  lambda b, h, vb, n: (b, h, vb, 0)))
    out_names.append("final_state")
  kernel = functools.partial(
      _forward_kernel, names=names + out_names + ["state"], spec=spec,
      subs=lay.chunk // lay.sub_chunk, last_chunk=n_chunks - 1)
  outs = pl.pallas_call(
      kernel, out_shape=out_shape, grid=(b, h, v_blocks, n_chunks),
      in_specs=in_specs, out_specs=out_specs,
      scratch_shapes=[pltpu.VMEM((lay.block_v, lay.k_pad), _F32)],
      compiler_params=_params(3), interpret=interpret,
      name="gated_linear_forward")(*arrays.values())
  return outs[0], (outs[1] if final_state else None)


def _dq_kernel(*refs, names, spec, subs):
  r = dict(zip(names, refs))

  @pl.when(pl.program_id(2) == 0)
  def _():
    if "initial_state" in r:
      r["state"][...] = r["initial_state"][...]
    else:
      r["state"][...] = jnp.zeros(r["state"].shape, _F32)

  c = spec.sub_chunk
  state = r["state"][...]                                       # [V, K]
  if "checkpoints" in r:
    r["checkpoints"][...] = state
  for s in range(subs):
    dq, gate_q, state = sub_chunk.dq_step(r, spec, s * c, s, state)
    r["dq"][pl.ds(s * c, c), :] = dq
    if "gate_q" in r:
      r["gate_q"][pl.ds(s * c, c), :] = gate_q
  r["state"][...] = state


def dq(arrays, spec, lay: Layout, *, interpret: bool = False):
  """``(dq [B, H, T_pad, K_pad] float32 (the query scale included),
  gate_q [B, H, T_pad, G] or None, checkpoints [B, H, N, V_pad, K_pad] or
  None)``.

  With a decay: ``gate_q`` holds the forward sweep's terms of the
  log-decays' gradient (``sub_chunk.dq_step``) and ``checkpoints`` the state
  entering each chunk, for the reverse sweep.
  """
  names = list(arrays)
  b, h, n_chunks = lay.batch, lay.heads, lay.t_pad // lay.chunk
  full = dataclasses.replace(lay, block_v=lay.v_pad)
  out_shape = [jax.ShapeDtypeStruct((b, h, lay.t_pad, lay.k_pad), _F32)]
  out_specs = [pl.BlockSpec((None, None, lay.chunk, lay.k_pad),
                            lambda b, h, n: (b, h, n, 0))]
  out_names = ["dq"]
  if spec.gate != "none":
    width = sub_chunk.gate_width(spec, lay.k_pad)
    out_shape += [
        jax.ShapeDtypeStruct((b, h, lay.t_pad, width), _F32),
        jax.ShapeDtypeStruct((b, h, n_chunks, lay.v_pad, lay.k_pad), _F32)]
    out_specs += [
        pl.BlockSpec((None, None, lay.chunk, width),
                     lambda b, h, n: (b, h, n, 0)),
        pl.BlockSpec((None, None, None, lay.v_pad, lay.k_pad),
                     lambda b, h, n: (b, h, n, 0, 0))]
    out_names += ["gate_q", "checkpoints"]
  kernel = functools.partial(_dq_kernel, names=names + out_names + ["state"],
                             spec=spec, subs=lay.chunk // lay.sub_chunk)
  outs = pl.pallas_call(
      kernel, out_shape=out_shape, grid=(b, h, n_chunks),
      in_specs=_in_specs(names, arrays, full, lambda n: n, lambda n: 0),
      out_specs=out_specs,
      scratch_shapes=[pltpu.VMEM((lay.v_pad, lay.k_pad), _F32)],
      compiler_params=_params(2), interpret=interpret,
      name="gated_linear_dq")(*arrays.values())
  if spec.gate == "none":
    return outs[0], None, None
  return tuple(outs)


def _dkv_kernel(*refs, names, spec, subs, last_step):
  r = dict(zip(names, refs))
  n = pl.program_id(2)

  @pl.when(n == 0)
  def _():
    if "d_final" in r:
      r["d_state"][...] = r["d_final"][...]
    else:
      r["d_state"][...] = jnp.zeros(r["d_state"].shape, _F32)

  c = spec.sub_chunk
  if "checkpoints" in r:
    # The state entering each sub-chunk, recomputed from the chunk's entry.
    state = r["checkpoints"][...]                               # [V, K]
    for s in range(subs):
      r["entry_states"][s] = state
      state = sub_chunk.advance_from(r, spec, s * c, s, state)
  d_state = r["d_state"][...]                                   # [V, K]
  for s in reversed(range(subs)):
    state_in = r["entry_states"][s] if "checkpoints" in r else None
    dk, dv, d_state, terms = sub_chunk.dkv_step(r, spec, s * c, s, d_state,
                                                state_in)
    r["dk"][pl.ds(s * c, c), :] = dk
    r["dv"][pl.ds(s * c, c), :] = dv
    if terms is not None:
      sub_chunk.store_gate_terms(r, terms, s * c, s, spec)
  r["d_state"][...] = d_state
  if "d_initial" in r:
    @pl.when(n == last_step)
    def _():
      r["d_initial"][...] = d_state


def dkv(arrays, spec, lay: Layout, *, d_initial: bool,
        interpret: bool = False):
  """``(dk [B, H, T_pad, K_pad], dv [B, H, T_pad, V_pad], d_initial
  [B, H, V_pad, K_pad] or None, gate terms {name: array})``, float32; walks
  the chunks backwards.

  With a decay, ``arrays`` holds the ``checkpoints`` of ``dq`` and the gate
  terms are those of ``sub_chunk.gate_term_outputs``; else they are empty.
  """
  names = list(arrays)
  b, h, n_chunks = lay.batch, lay.heads, lay.t_pad // lay.chunk
  subs = lay.chunk // lay.sub_chunk
  full = dataclasses.replace(lay, block_v=lay.v_pad)
  backwards = lambda n: n_chunks - 1 - n  # noqa: E731
  out_shape = [jax.ShapeDtypeStruct((b, h, lay.t_pad, lay.k_pad), _F32),
               jax.ShapeDtypeStruct((b, h, lay.t_pad, lay.v_pad), _F32)]
  out_specs = [pl.BlockSpec((None, None, lay.chunk, lay.k_pad),
                            lambda b, h, n: (b, h, backwards(n), 0)),
               pl.BlockSpec((None, None, lay.chunk, lay.v_pad),
                            lambda b, h, n: (b, h, backwards(n), 0))]
  out_names = ["dk", "dv"]
  if d_initial:
    out_shape.append(jax.ShapeDtypeStruct((b, h, lay.v_pad, lay.k_pad), _F32))
    out_specs.append(pl.BlockSpec((None, None, lay.v_pad, lay.k_pad),
                                  lambda b, h, n: (b, h, 0, 0)))
    out_names.append("d_initial")
  scratch = [pltpu.VMEM((lay.v_pad, lay.k_pad), _F32)]
  scratch_names = ["d_state"]
  gate_terms = sub_chunk.gate_term_outputs(spec, lay.k_pad)
  for name, per_token, width in gate_terms:
    if per_token:
      out_shape.append(jax.ShapeDtypeStruct((b, h, lay.t_pad, width), _F32))
      out_specs.append(pl.BlockSpec((None, None, lay.chunk, width),
                                    lambda b, h, n: (b, h, backwards(n), 0)))
    else:
      out_shape.append(jax.ShapeDtypeStruct(
          (b, h, lay.t_pad // lay.sub_chunk, 1, width), _F32))
      out_specs.append(pl.BlockSpec(
          (None, None, subs, 1, width),
          lambda b, h, n: (b, h, backwards(n), 0, 0)))
    out_names.append(name)
  if gate_terms:
    scratch.append(pltpu.VMEM((subs, lay.v_pad, lay.k_pad), _F32))
    scratch_names.append("entry_states")
  kernel = functools.partial(
      _dkv_kernel, names=names + out_names + scratch_names, spec=spec,
      subs=subs, last_step=n_chunks - 1)
  outs = list(pl.pallas_call(
      kernel, out_shape=out_shape, grid=(b, h, n_chunks),
      in_specs=_in_specs(names, arrays, full, backwards, lambda n: 0),
      out_specs=out_specs, scratch_shapes=scratch,
      compiler_params=_params(2), interpret=interpret,
      name="gated_linear_dkv")(*arrays.values()))
  dk, dv = outs.pop(0), outs.pop(0)
  ds0 = outs.pop(0) if d_initial else None
  return dk, dv, ds0, dict(zip(out_names[-len(gate_terms):], outs)
                           if gate_terms else {})
