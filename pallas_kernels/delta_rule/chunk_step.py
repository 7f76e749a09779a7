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
for its own block.

Numerics: the state, every product and every accumulation are float32.
bfloat16 inputs use bfloat16 matmul operands (the state and the
pseudo-values rounded for the product, as the inputs are) with float32
accumulation; float32 inputs use float32 matmuls at the highest precision.

Letters: i and j rows of a chunk, k key channel, v value channel.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32
NN = (((1,), (0,)), ((), ()))  # a @ b
NT = (((1,), (1,)), ((), ()))  # a @ b.T
TN = (((0,), (0,)), ((), ()))  # a.T @ b


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """What a kernel body is specialised for (all static)."""
  bf16_dots: bool    # matmul operands in bfloat16 (bfloat16 inputs); else
                     # float32 operands at the highest precision


def dot(a, b, dims, spec: KernelSpec):
  """A float32-accumulated matmul (dims: ``NN``, ``NT`` or ``TN``)."""
  if spec.bf16_dots:
    return lax.dot_general(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                           dims, preferred_element_type=_F32)
  return lax.dot_general(a.astype(_F32), b.astype(_F32), dims,
                         precision=lax.Precision.HIGHEST,
                         preferred_element_type=_F32)


class Chunk(NamedTuple):
  """The prepared terms of one chunk, as loaded (input dtype)."""
  w: jax.Array        # [C, K] W
  u: jax.Array        # [C, V] U' (a block of value columns)
  q: jax.Array        # [C, K] Q
  scores: jax.Array   # [C, C] P
  k: jax.Array        # [C, K] K
  decay: jax.Array    # [1, K] d, float32


class ChunkGrads(NamedTuple):
  """Gradients of one chunk's terms, float32 (sums over this program's
  value columns, except ``u``, which is its columns)."""
  w: jax.Array        # [C, K]
  u: jax.Array        # [C, V]
  q: jax.Array        # [C, K]
  scores: jax.Array   # [C, C]
  k: jax.Array        # [C, K]
  decay: jax.Array    # [1, K]


def forward(chunk: Chunk, state, spec: KernelSpec, *, outputs: bool = True):
  """``(o [C, V] float32 or None, state leaving the chunk [V, K])`` from
  the state entering it, ``[V, K]`` float32."""
  u = chunk.u.astype(_F32) - dot(chunk.w, state, NT, spec)     # [C, V]
  o = None
  if outputs:
    o = (dot(chunk.q, state, NT, spec)
         + dot(chunk.scores, u, NN, spec))                      # [C, V]
  state = state * chunk.decay + dot(u, chunk.k, TN, spec)       # [V, K]
  return o, state


def backward(chunk: Chunk, do, state, d_state, spec: KernelSpec):
  """``(ChunkGrads, gradient of the state entering the chunk [V, K])``.

  ``do: [C, V]``; ``state``: the state entering the chunk, ``d_state``: the
  gradient of the state leaving it, both ``[V, K]`` float32.
  """
  u = chunk.u.astype(_F32) - dot(chunk.w, state, NT, spec)     # [C, V]
  du = (dot(chunk.scores, do, TN, spec)
        + dot(chunk.k, d_state, NT, spec))                      # [C, V]
  grads = ChunkGrads(
      w=-dot(du, state, NN, spec),                              # [C, K]
      u=du,
      q=dot(do, state, NN, spec),                               # [C, K]
      scores=dot(do, u, NT, spec),                              # [C, C]
      k=dot(u, d_state, NN, spec),                              # [C, K]
      decay=jnp.sum(state * d_state, axis=0, keepdims=True))    # [1, K]
  d_state = (d_state * chunk.decay + dot(do, chunk.q, TN, spec)
             - dot(du, chunk.w, TN, spec))                      # [V, K]
  return grads, d_state
