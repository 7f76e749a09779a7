"""The kernel body: one chunk of the delta rule's sweep, on loaded values.

The Mosaic (TPU) kernel runs ``step``; the Triton (GPU) kernel
(``gpu.py``) runs the same products transposed, on an untransposed state
kept in memory one key block at a time, and shares ``dot`` and the input
names.

The sweep over chunks, with the WY (UT) terms prepared outside it
(``ops.py``; the derivation is in ``lin_attn_jax/ops/delta_rule/README.md``)
and ``S_n`` the state entering chunk ``n``, kept transposed as
``X_n = S_n^T: [V, K]``, is

    U_n     = U'_n - W_n S_n                 pseudo-values
    S_{n+1} = diag(d_n) S_n + K_n^T U_n

The outputs ``o_n = Q_n S_n + P_n U_n`` need nothing sequential once every
``S_n`` and ``U_n`` is known, so they are not computed here: the kernels
write ``S_n`` and ``U_n`` and the outputs are products over all chunks at
once (``ops.py``), as flash-linear-attention splits its ``chunk_delta_h``
and ``chunk_o`` kernels. The gradient of the sweep is the same recurrence
walked backwards (it is linear in ``(U', S)``): with ``dS_{n+1}`` the
gradient of the state leaving chunk ``n`` and ``gU_n = P_n^T do_n``,
``gS_n = Q_n^T do_n`` the gradients the outputs send,

    dU_n = gU_n + K_n dS_{n+1}               (= dU'_n)
    dS_n = diag(d_n) dS_{n+1} + Q_n^T do_n - W_n^T dU_n

So one body serves both directions: per chunk, from the carried state
``x`` (``[V, block_k]`` blocks of key columns, one at a time),

    y = a + M1 x^T                            [C, V]
    x = x * d + y^T M2 (+ E_a^T E_b)          [V, K]

forward: ``a = U'``, ``M1 = -W``, ``M2 = K``, no ``E``; backward (chunks in
reverse): ``a = gU``, ``M1 = K``, ``M2 = -W``, ``E = (do, Q)``. The kernels
write ``x`` entering each chunk (``S_n``, or ``dS_{n+1}``) and ``y``
(``U_n``, or ``dU_n``). Each value column of the state evolves on its own
(``M1 x^T`` mixes key channels only), so a program owns a block of value
columns and its ``y`` and ``x`` are just its columns: nothing is summed
across programs.

Numerics: the state, ``a``, ``y`` and every accumulation are float32.
bfloat16 inputs use bfloat16 matmul operands (the terms, and the state and
``y`` rounded for their products, as flash-linear-attention does) with
float32 accumulation; float32 inputs use float32 matmuls
(``pallas_kernels.common.dots``: the highest precision on TPU, 3xTF32 on
GPU).

Letters: c row of a chunk, k key channel, v value channel.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp

from pallas_kernels.common import dots
from pallas_kernels.common.dots import NT, TN

_F32 = jnp.float32

# Inputs with key columns (loaded one block of ``block_k`` at a time), and
# with value columns (this program's block, whole).
KEY_INPUTS = ("m1", "m2", "decay", "e_b")
VALUE_INPUTS = ("a", "e_a")


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """What a kernel body is specialised for (all static)."""
  bf16_dots: bool       # matmul operands in bfloat16 (bfloat16 inputs);
                        # else float32 (``pallas_kernels.common.dots``)
  backend: str = "tpu"  # "tpu" or "gpu": how float32 matmuls run
  extra: bool = False   # the E_a^T E_b term (the backward sweep)


def dot(a, b, dims, spec: KernelSpec):
  """A float32-accumulated matmul (dims: ``NN``, ``NT`` or ``TN``)."""
  return dots.dot(a, b, dims, mode=dots.mode(bf16=spec.bf16_dots,
                                              backend=spec.backend))


# load(name, kb): the chunk's input ``name`` as stored: block ``kb`` of
# ``block_k`` key columns of a ``KEY_INPUTS`` one ([C, block_k], the decay
# [1, block_k]), or the program's value columns of a ``VALUE_INPUTS`` one
# ([C, block_v], kb None).
Load = Callable[[str, "int | None"], object]


def step(load: Load, state: Callable, write: Callable, blocks: int,
         spec: KernelSpec):
  """One chunk: ``y [C, V]`` float32 (returned) from the state before it,
  and the state after it. ``state(kb)`` reads block ``kb`` of ``blocks``
  ``[V, block_k]`` float32 blocks of key columns of the carried state and
  ``write(kb, x)`` replaces it: the kernel keeps the state in VMEM and
  moves one block at a time through registers."""
  y = load("a", None).astype(_F32)
  for kb in range(blocks):
    y = y + dot(load("m1", kb), state(kb), NT, spec)            # [C, V]
  e_a = load("e_a", None) if spec.extra else None
  for kb in range(blocks):
    x = state(kb) * load("decay", kb) + dot(y, load("m2", kb), TN, spec)
    if spec.extra:
      x = x + dot(e_a, load("e_b", kb), TN, spec)
    write(kb, x)                                                # [V, K]
  return y
