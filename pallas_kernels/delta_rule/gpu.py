"""Triton (GPU) kernel of the delta rule's chunk sweep.

Triton programs run independently and have no scratch memory, so each
program owns one (batch, head, block of value columns) for the whole
sequence: grid ``(B, H, V blocks)``, a ``fori_loop`` over the chunks (from
the last one in the backward sweep), reading chunk ``n`` of each input as
``ref[n]``.

The carried state does not live in registers: it lives in the kernel's
``states`` output, which holds the state entering every chunk anyway. With
``N + 1`` slots (the last, or in the backward sweep the first, is the final
state), a chunk reads its entering state from one slot and writes the next
one, one ``[block_k, block_v]`` block of key rows at a time in a
``fori_loop`` over key blocks, untransposed (``chunk_step.step`` with the
products transposed):

    y    = a + sum_kb M1_kb S_kb                        [C, block_v]
    S'_kb = d_kb * S_kb + M2_kb^T y (+ E_b,kb^T E_a)    [block_k, block_v]

so a program's registers hold ``y`` and one block of each operand, however
wide ``K`` is (a register-resident ``[K, block_v]`` float32 state made
ptxas spill on sm_80 at K = 128 already). A barrier after each chunk's
writes makes them visible to the whole program before the next chunk reads
them (threads read blocks other threads wrote). Key inputs are laid out key
block major (``[N, K blocks, C, block_k]``), so a block is ``ref[n, kb]``.
Tiles have power-of-two sizes (chunk rows, ``K`` and ``V`` padded to a
power of two >= 16, as ``tl.dot`` needs).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.common import compiler
from pallas_kernels.common.dots import NN, TN
from pallas_kernels.delta_rule import chunk_step
from pallas_kernels.delta_rule.block_sizes import BlockSizes
from pallas_kernels.delta_rule.layout import Layout

_F32 = jnp.float32


def _in_specs(names, arrays, lay: Layout):
  """Whole-sequence blocks; the grid is ``(b, h, vb)``."""
  out = []
  for name in names:
    shape = arrays[name].shape
    if name in chunk_step.KEY_INPUTS:
      spec = pl.BlockSpec((None, None) + shape[2:],
                          lambda b, h, vb: (b, h, 0, 0, 0, 0))
    elif name in chunk_step.VALUE_INPUTS:
      spec = pl.BlockSpec((None, None, lay.chunks, shape[-2], lay.block_v),
                          lambda b, h, vb: (b, h, 0, 0, vb))
    elif name == "initial_state":
      spec = pl.BlockSpec((None, None, lay.k_blocks, lay.block_k,
                           lay.block_v),
                          lambda b, h, vb: (b, h, 0, 0, vb))
    else:
      raise ValueError(f"unknown kernel input {name!r}")
    out.append(spec)
  return out


def _kernel(*refs, names, spec, lay, reverse, barrier):
  """One program: the chunks in sweep order, the state in the ``states``
  slots; ``barrier`` (off in interpret mode, where programs run one after
  another) orders each chunk's writes before the next chunk's reads."""
  r = dict(zip(names, refs))
  x = r["states"]                              # [N + 1, K blocks, bk, V]
  dot = functools.partial(chunk_step.dot, spec=spec)
  sync = pltriton.debug_barrier if barrier else (lambda: None)
  first = lay.chunks if reverse else 0         # slot of the entering state

  def init(kb, carry):
    if "initial_state" in r:
      x[first, kb] = r["initial_state"][kb]
    else:
      x[first, kb] = jnp.zeros((lay.block_k, lay.block_v), _F32)
    return carry

  def chunk(i, carry):
    n = lay.chunks - 1 - i if reverse else i
    src, dst = (n + 1, n) if reverse else (n, n + 1)

    def product(kb, y):
      return y + dot(r["m1"][n, kb], x[src, kb], NN)            # [C, V]

    y = lax.fori_loop(0, lay.k_blocks, product, r["a"][n].astype(_F32))
    r["y"][n] = y

    def update(kb, carry):
      s = x[src, kb] * r["decay"][n, kb] + dot(r["m2"][n, kb], y, TN)
      if spec.extra:
        s = s + dot(r["e_b"][n, kb], r["e_a"][n], TN)
      x[dst, kb] = s                                            # [bk, V]
      return carry

    lax.fori_loop(0, lay.k_blocks, update, 0)
    sync()
    return carry

  lax.fori_loop(0, lay.k_blocks, init, 0)
  sync()
  lax.fori_loop(0, lay.chunks, chunk, 0)


def _key_major(x, lay: Layout):
  """``[B, H, N, R, K_pad] -> [B, H, N, K blocks, R, block_k]``, so the
  loops over key blocks index a leading axis (``ref[n, kb]``)."""
  b, h, n, rows, _ = x.shape
  x = x.reshape(b, h, n, rows, lay.k_blocks, lay.block_k)
  return jnp.transpose(x, (0, 1, 2, 4, 3, 5))


def sweep(arrays, spec, lay: Layout, blocks: BlockSizes, *, reverse: bool,
          final_state: bool, name: str, cost, interpret: bool = False):
  """As ``tpu.sweep``: ``(y [B, H, N, C_pad, V_pad], x entering each chunk
  [B, H, N, V_pad, K_pad], final [B, H, V_pad, K_pad] or None)``,
  float32."""
  b, h, n_chunks = lay.batch, lay.heads, lay.chunks
  kb, bk = lay.k_blocks, lay.block_k
  arrays = dict(arrays)
  for key in chunk_step.KEY_INPUTS:
    if key in arrays:
      arrays[key] = _key_major(arrays[key], lay)
  # The decay scales key rows of the state: [B, H, N, K blocks, bk, 1].
  arrays["decay"] = jnp.swapaxes(arrays["decay"], -1, -2)
  if "initial_state" in arrays:
    arrays["initial_state"] = jnp.swapaxes(
        arrays["initial_state"], -1, -2).reshape(b, h, kb, bk, lay.v_pad)
  names = list(arrays)
  outputs = [
      ("y", jax.ShapeDtypeStruct((b, h, n_chunks, lay.c_pad, lay.v_pad),
                                 _F32),
       pl.BlockSpec((None, None, n_chunks, lay.c_pad, lay.block_v),
                    lambda b, h, vb: (b, h, 0, 0, vb))),
      ("states", jax.ShapeDtypeStruct(
          (b, h, n_chunks + 1, kb, bk, lay.v_pad), _F32),
       pl.BlockSpec((None, None, n_chunks + 1, kb, bk, lay.block_v),
                    lambda b, h, vb: (b, h, 0, 0, 0, vb)))]
  kernel = functools.partial(
      _kernel, names=names + [o[0] for o in outputs], spec=spec, lay=lay,
      reverse=reverse, barrier=not interpret)
  outs = pl.pallas_call(
      kernel, out_shape=[shape for _, shape, _ in outputs],
      grid=(b, h, lay.v_blocks),
      in_specs=_in_specs(names, arrays, lay),
      out_specs=[s for _, _, s in outputs],
      compiler_params=compiler.gpu_params(blocks.num_warps, blocks.num_stages),
      cost_estimate=cost, interpret=interpret, name=name,
  )(*arrays.values())
  slots = jnp.swapaxes(outs[1].reshape(b, h, n_chunks + 1, lay.k_pad,
                                       lay.v_pad), -1, -2)  # [B,H,N+1,V,K]
  states, final = ((slots[:, :, 1:], slots[:, :, 0]) if reverse else
                   (slots[:, :, :-1], slots[:, :, -1]))
  return outs[0], states, (final if final_state else None)
