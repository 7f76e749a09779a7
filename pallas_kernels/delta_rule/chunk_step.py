"""The kernel body: one chunk of the delta rule's sweep, on loaded values.

Shared by the Mosaic (TPU) and Triton (GPU) kernels, which differ only in
how they walk the chunks (grid steps on TPU, one ``fori_loop`` per program
on GPU) and where they keep the state.

Per chunk of ``C`` tokens, with the WY (UT) terms prepared outside the
sweep (``ops.py``; the derivation is in
``lin_attn_jax/ops/delta_rule/README.md``) and ``S`` the state entering the
chunk, kept transposed as ``X = S^T: [V, K]``:

    U  = U' - W S                    pseudo-values (what the chunk writes)
    o  = Q S + P U                   outputs
    S' = diag(d) S + K^T U           the state leaving the chunk

and, going back, from ``dS'`` (the gradient of the state leaving it) and
``do``:

    dU  = P^T do + K dS'             (= dU', the gradient of U')
    dW  = -dU S^T     dQ = do S^T     dP = do U^T     dK = U dS'^T
    dd  = sum_v S * dS'              (per key channel)
    dS  = diag(d) dS' + Q^T do - W^T dU

Each value column of the state evolves on its own (``W S`` mixes key
channels only), so a program may own a block of value columns: ``U``,
``o``, ``dU`` and the states split by columns; ``dW``, ``dQ``, ``dP``,
``dK`` and ``dd`` are sums over value columns, which each program returns
for its own block. Inside a program the state is held as blocks of key
columns, ``[V, block_k]`` each, and every product runs on blocks of
``block_c`` rows and ``block_k`` key columns (``W S``, ``Q S`` summed block
by block), so no ``[C, K]`` or ``[C, C]`` term is loaded whole: the
registers a GPU program needs do not grow with ``K`` or ``C`` beyond the
state itself.

Numerics: the state, every product and every accumulation are float32.
bfloat16 inputs use bfloat16 matmul operands (the state and the
pseudo-values rounded for the product, as the inputs are) with float32
accumulation; float32 inputs use float32 matmuls (on GPU as three TF32
products on the tensor cores, ``pallas_kernels.common.dots``).

Letters: i and j rows of a chunk, k key channel, v value channel.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp

from pallas_kernels.common import dots
from pallas_kernels.common.dots import NN, NT, TN

_F32 = jnp.float32
GRAD_NAMES = ("w", "u", "q", "scores", "k", "decay")


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """What a kernel body is specialised for (all static)."""
  bf16_dots: bool    # matmul operands in bfloat16 (bfloat16 inputs); else
                     # float32 (``pallas_kernels.common.dots``)
  backend: str = "tpu"  # "tpu" or "gpu": how float32 matmuls run


def dot(a, b, dims, spec: KernelSpec):
  """A float32-accumulated matmul (dims: ``NN``, ``NT`` or ``TN``)."""
  return dots.dot(a, b, dims, mode=dots.mode(bf16=spec.bf16_dots,
                                              backend=spec.backend))


# load(name, rb, cb): block (rb, cb) of the chunk's term ``name`` as loaded
# (input dtype): rows in blocks of ``block_c`` (rb None: the one row of
# ``decay``), columns in blocks of ``block_k`` key channels (``w``, ``q``,
# ``k``, ``decay``), of ``block_c`` rows (``scores``), or all of this
# program's value columns (``u``, ``do``: cb None).
Load = Callable[[str, "int | None", "int | None"], object]


def _pseudo_values(load: Load, state, spec: KernelSpec, row_blocks: int):
  """``U = U' - W S`` by row blocks: ``[block_c, V]`` float32 each."""
  u = []
  for rb in range(row_blocks):
    u_r = load("u", rb, None).astype(_F32)
    for kb, s in enumerate(state):
      u_r = u_r - dot(load("w", rb, kb), s, NT, spec)           # [c, V]
    u.append(u_r)
  return u


def forward(load: Load, state, spec: KernelSpec, row_blocks: int, *,
            outputs: bool = True):
  """``(o, state leaving the chunk)`` from the state entering it.

  States are tuples of ``[V, block_k]`` float32 blocks; ``o`` is None or a
  list of ``[block_c, V]`` float32 row blocks. ``P`` is lower triangular,
  so row block ``rb`` of ``P U`` reads the row blocks ``cb <= rb`` of
  ``U``.
  """
  u = _pseudo_values(load, state, spec, row_blocks)
  o = None
  if outputs:
    o = []
    for rb in range(row_blocks):
      o_r = dot(load("scores", rb, 0), u[0], NN, spec)          # [c, V]
      for cb in range(1, rb + 1):
        o_r = o_r + dot(load("scores", rb, cb), u[cb], NN, spec)
      for kb, s in enumerate(state):
        o_r = o_r + dot(load("q", rb, kb), s, NT, spec)
      o.append(o_r)
  new_state = []
  for kb, s in enumerate(state):
    s = s * load("decay", None, kb)                             # [V, K]
    for rb in range(row_blocks):
      s = s + dot(u[rb], load("k", rb, kb), TN, spec)
    new_state.append(s)
  return o, tuple(new_state)


def backward(load: Load, state, d_state, spec: KernelSpec, row_blocks: int,
             store):
  """The gradient of the state entering the chunk (a tuple of blocks).

  ``state``: the state entering the chunk, ``d_state``: the gradient of the
  state leaving it, both tuples of ``[V, block_k]`` float32 blocks.
  ``store(name, rb, cb, grad)`` receives the float32 gradient of each block
  of each term (blocks as in ``load``): sums over this program's value
  columns, except ``u``, which is its columns.
  """
  u = _pseudo_values(load, state, spec, row_blocks)             # [c, V]
  do = [load("do", rb, None) for rb in range(row_blocks)]
  du = []
  for rb in range(row_blocks):
    du_r = dot(load("scores", rb, rb), do[rb], TN, spec)        # [c, V]
    for later in range(rb + 1, row_blocks):
      du_r = du_r + dot(load("scores", later, rb), do[later], TN, spec)
    for kb, ds in enumerate(d_state):
      du_r = du_r + dot(load("k", rb, kb), ds, NT, spec)
    store("u", rb, None, du_r)
    du.append(du_r)
  for rb in range(row_blocks):
    for cb in range(row_blocks):
      store("scores", rb, cb, dot(do[rb], u[cb], NT, spec))     # [c, c]
  d_entering = []
  for kb, (s, ds) in enumerate(zip(state, d_state)):
    store("decay", None, kb, jnp.sum(s * ds, axis=0, keepdims=True))
    d_s = ds * load("decay", None, kb)                          # [V, K]
    for rb in range(row_blocks):
      store("w", rb, kb, -dot(du[rb], s, NN, spec))             # [c, K]
      store("q", rb, kb, dot(do[rb], s, NN, spec))
      store("k", rb, kb, dot(u[rb], ds, NN, spec))
      d_s = (d_s + dot(do[rb], load("q", rb, kb), TN, spec)
             - dot(du[rb], load("w", rb, kb), TN, spec))
    d_entering.append(d_s)
  return tuple(d_entering)
