"""Triton (GPU) kernels of the chunked gated-linear recurrence.

Triton programs run independently and have no scratch memory, so each
program owns one (batch, head) pair, and for the forward pass one block of
value columns, for the whole sequence: it walks the sub-chunks in a
``fori_loop`` with the ``[V, K]`` float32 state in registers as the loop
carry. Tiles have power-of-two sizes (``K``, ``V`` padded to a
power of two >= 16, sub-chunks of 16 rows or more for ``tl.dot``).

- ``forward``: outputs and the final state; grid ``(B, H, V blocks)``.
- ``dq``: the forward sweep of the backward pass (recomputes the states and,
  with a decay, writes the state entering each chunk as a checkpoint).
- ``dkv``: the reverse sweep, one chunk per loop step, its sub-chunks
  unrolled. With a decay it recomputes the state entering each sub-chunk
  from the chunk's checkpoint, for the log-decays' gradient: ``s`` state
  updates for sub-chunk ``s``, since registers hold one state at a time.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.gated_linear import sub_chunk
from pallas_kernels.gated_linear.block_sizes import BlockSizes
from pallas_kernels.gated_linear.layout import Layout

_F32 = jnp.float32


def _v_block(vb):
  return vb[0] if vb else 0


def _in_specs(names, arrays, lay: Layout, block_v: int):
  """Whole-sequence blocks; grid indices are (b, h[, v block])."""
  n_sub = lay.t_pad // lay.sub_chunk
  out = []
  for name in names:
    shape = arrays[name].shape
    if name in ("q", "k", "gate", "do"):
      spec = pl.BlockSpec((None, None, lay.t_pad, shape[-1]),
                          lambda b, h, *vb: (b, h, 0, 0))
    elif name == "v":
      spec = pl.BlockSpec((None, None, lay.t_pad, block_v),
                          lambda b, h, *vb: (b, h, 0, _v_block(vb)))
    elif name == "gate_row":
      spec = pl.BlockSpec((None, None, n_sub, 1, lay.sub_chunk),
                          lambda b, h, *vb: (b, h, 0, 0, 0))
    elif name in ("doc", "doc_prev"):
      spec = pl.BlockSpec((None, lay.t_pad, 1), lambda b, h, *vb: (b, 0, 0))
    elif name == "doc_row":
      spec = pl.BlockSpec((None, n_sub, 1, lay.sub_chunk),
                          lambda b, h, *vb: (b, 0, 0, 0))
    elif name == "checkpoints":
      spec = pl.BlockSpec((None, None, lay.t_pad // lay.chunk, lay.v_pad,
                           lay.k_pad), lambda b, h, *vb: (b, h, 0, 0, 0))
    elif name in ("initial_state", "d_final"):
      spec = pl.BlockSpec((None, None, block_v, lay.k_pad),
                          lambda b, h, *vb: (b, h, _v_block(vb), 0))
    else:
      raise ValueError(f"unknown kernel input {name!r}")
    out.append(spec)
  return out


def _params(blocks: BlockSizes):
  return pltriton.CompilerParams(num_warps=blocks.num_warps,
                                 num_stages=blocks.num_stages)


def _initial(r, name, shape):
  return r[name][...] if name in r else jnp.zeros(shape, _F32)


def _forward_kernel(*refs, names, spec, n_sub, shape):
  r = dict(zip(names, refs))
  c = spec.sub_chunk

  def body(i, state):
    start = pl.multiple_of(i * c, c)
    o, state = sub_chunk.forward_step(r, spec, start, i, state)
    r["o"][pl.ds(start, c), :] = o.astype(r["o"].dtype)
    return state

  state = lax.fori_loop(0, n_sub, body, _initial(r, "initial_state", shape))
  if "final_state" in r:
    r["final_state"][...] = state


def forward(arrays, spec, lay: Layout, blocks: BlockSizes, *, out_dtype,
            final_state: bool, interpret: bool = False):
  """``(o [B, H, T_pad, V_pad], final state [B, H, V_pad, K_pad] or None)``."""
  names = list(arrays)
  b, h, bv = lay.batch, lay.heads, lay.block_v
  out_shape = [jax.ShapeDtypeStruct((b, h, lay.t_pad, lay.v_pad), out_dtype)]
  out_specs = [pl.BlockSpec((None, None, lay.t_pad, bv),
                            lambda b, h, vb: (b, h, 0, vb))]
  out_names = ["o"]
  if final_state:
    out_shape.append(jax.ShapeDtypeStruct((b, h, lay.v_pad, lay.k_pad), _F32))
    out_specs.append(pl.BlockSpec((None, None, bv, lay.k_pad),
                                  lambda b, h, vb: (b, h, vb, 0)))
    out_names.append("final_state")
  kernel = functools.partial(
      _forward_kernel, names=names + out_names, spec=spec,
      n_sub=lay.t_pad // lay.sub_chunk, shape=(bv, lay.k_pad))
  outs = pl.pallas_call(
      kernel, out_shape=out_shape, grid=(b, h, lay.v_pad // bv),
      in_specs=_in_specs(names, arrays, lay, bv), out_specs=out_specs,
      compiler_params=_params(blocks), interpret=interpret,
      name="gated_linear_forward")(*arrays.values())
  return outs[0], (outs[1] if final_state else None)


def _dq_kernel(*refs, names, spec, n_sub, subs, shape):
  r = dict(zip(names, refs))
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

  lax.fori_loop(0, n_sub, body, _initial(r, "initial_state", shape))


def dq(arrays, spec, lay: Layout, blocks: BlockSizes, *,
       interpret: bool = False):
  """``(dq [B, H, T_pad, K_pad] float32 (the query scale included),
  gate_q [B, H, T_pad, G] or None, checkpoints [B, H, N, V_pad, K_pad] or
  None)``.

  With a decay: ``gate_q`` holds the forward sweep's terms of the
  log-decays' gradient (``sub_chunk.dq_step``) and ``checkpoints`` the state
  entering each chunk, for the reverse sweep.
  """
  names = list(arrays)
  b, h, n_chunks = lay.batch, lay.heads, lay.t_pad // lay.chunk
  out_shape = [jax.ShapeDtypeStruct((b, h, lay.t_pad, lay.k_pad), _F32)]
  out_specs = [pl.BlockSpec((None, None, lay.t_pad, lay.k_pad),
                            lambda b, h: (b, h, 0, 0))]
  out_names = ["dq"]
  if spec.gate != "none":
    width = sub_chunk.gate_width(spec, lay.k_pad)
    out_shape += [
        jax.ShapeDtypeStruct((b, h, lay.t_pad, width), _F32),
        jax.ShapeDtypeStruct((b, h, n_chunks, lay.v_pad, lay.k_pad), _F32)]
    out_specs += [
        pl.BlockSpec((None, None, lay.t_pad, width), lambda b, h: (b, h, 0, 0)),
        pl.BlockSpec((None, None, n_chunks, lay.v_pad, lay.k_pad),
                     lambda b, h: (b, h, 0, 0, 0))]
    out_names += ["gate_q", "checkpoints"]
  kernel = functools.partial(_dq_kernel, names=names + out_names, spec=spec,
                             n_sub=lay.t_pad // lay.sub_chunk,
                             subs=lay.chunk // lay.sub_chunk,
                             shape=(lay.v_pad, lay.k_pad))
  outs = pl.pallas_call(
      kernel, out_shape=out_shape, grid=(b, h),
      in_specs=_in_specs(names, arrays, lay, lay.v_pad), out_specs=out_specs,
      compiler_params=_params(blocks), interpret=interpret,
      name="gated_linear_dq")(*arrays.values())
  if spec.gate == "none":
    return outs[0], None, None
  return tuple(outs)


def _dkv_kernel(*refs, names, spec, n_chunks, subs, shape):
  r = dict(zip(names, refs))
  c = spec.sub_chunk

  def body(i, d_state):
    n = n_chunks - 1 - i
    for s in reversed(range(subs)):
      index = n * subs + s
      state_in = None
      if "checkpoints" in r:
        # The state entering sub-chunk s, recomputed from the chunk's entry
        # (registers hold one state at a time, so each s starts over).
        state_in = r["checkpoints"][n]                          # [V, K]
        for t in range(s):
          state_in = sub_chunk.advance_from(
              r, spec, pl.multiple_of((n * subs + t) * c, c), n * subs + t,
              state_in)
      start = pl.multiple_of(index * c, c)
      dk, dv, d_state, terms = sub_chunk.dkv_step(r, spec, start, index,
                                                  d_state, state_in)
      r["dk"][pl.ds(start, c), :] = dk
      r["dv"][pl.ds(start, c), :] = dv
      if terms is not None:
        sub_chunk.store_gate_terms(r, terms, start, index, spec)
    return d_state

  d_state = lax.fori_loop(0, n_chunks, body, _initial(r, "d_final", shape))
  if "d_initial" in r:
    r["d_initial"][...] = d_state


def dkv(arrays, spec, lay: Layout, blocks: BlockSizes, *, d_initial: bool,
        interpret: bool = False):
  """``(dk [B, H, T_pad, K_pad], dv [B, H, T_pad, V_pad], d_initial
  [B, H, V_pad, K_pad] or None, gate terms {name: array})``, float32; walks
  the sequence backwards.

  With a decay, ``arrays`` holds the ``checkpoints`` of ``dq`` and the gate
  terms are those of ``sub_chunk.gate_term_outputs``; else they are empty.
  """
  names = list(arrays)
  b, h = lay.batch, lay.heads
  full = lambda b, h: (b, h, 0, 0)  # noqa: E731
  out_shape = [jax.ShapeDtypeStruct((b, h, lay.t_pad, lay.k_pad), _F32),
               jax.ShapeDtypeStruct((b, h, lay.t_pad, lay.v_pad), _F32)]
  out_specs = [pl.BlockSpec((None, None, lay.t_pad, lay.k_pad), full),
               pl.BlockSpec((None, None, lay.t_pad, lay.v_pad), full)]
  out_names = ["dk", "dv"]
  if d_initial:
    out_shape.append(jax.ShapeDtypeStruct((b, h, lay.v_pad, lay.k_pad), _F32))
    out_specs.append(pl.BlockSpec((None, None, lay.v_pad, lay.k_pad), full))
    out_names.append("d_initial")
  n_sub = lay.t_pad // lay.sub_chunk
  gate_terms = sub_chunk.gate_term_outputs(spec, lay.k_pad)
  for name, per_token, width in gate_terms:
    if per_token:
      out_shape.append(jax.ShapeDtypeStruct((b, h, lay.t_pad, width), _F32))
      out_specs.append(pl.BlockSpec((None, None, lay.t_pad, width), full))
    else:
      out_shape.append(jax.ShapeDtypeStruct((b, h, n_sub, 1, width), _F32))
      out_specs.append(pl.BlockSpec((None, None, n_sub, 1, width),
                                    lambda b, h: (b, h, 0, 0, 0)))
    out_names.append(name)
  kernel = functools.partial(_dkv_kernel, names=names + out_names, spec=spec,
                             n_chunks=lay.t_pad // lay.chunk,
                             subs=lay.chunk // lay.sub_chunk,
                             shape=(lay.v_pad, lay.k_pad))
  outs = list(pl.pallas_call(
      kernel, out_shape=out_shape, grid=(b, h),
      in_specs=_in_specs(names, arrays, lay, lay.v_pad), out_specs=out_specs,
      compiler_params=_params(blocks), interpret=interpret,
      name="gated_linear_dkv")(*arrays.values()))
  dk, dv = outs.pop(0), outs.pop(0)
  ds0 = outs.pop(0) if d_initial else None
  return dk, dv, ds0, dict(zip(out_names[-len(gate_terms):], outs)
                           if gate_terms else {})
