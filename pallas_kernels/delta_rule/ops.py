"""The delta rule's chunk sweep on Pallas kernels: dispatch and gradients.

The chunked delta rule (WY / UT form) has a chunk-local part, the terms
``ChunkTerms`` of every chunk (one small triangular inverse per chunk, no
dependence on the state), and a sequential part, the sweep over chunks:

    U_n = U'_n - W_n S_n,   o_n = Q_n S_n + P_n U_n,
    S_{n+1} = diag(d_n) S_n + K_n^T U_n

This module runs the sweep (``chunk_step.py`` has the equations of one
chunk and of its gradient):

- Forward: one kernel, outputs and the final state.
- Backward (``jax.custom_vjp``): the forward kernel again, writing the state
  entering each chunk instead of the outputs (nothing but the inputs is
  kept from the forward pass), then a reverse sweep kernel for the
  gradients of every term and of the initial state. XLA only adds up the
  parts of the gradients that programs owning different value columns
  return.

The terms themselves are prepared outside (``lin_attn_jax.ops.delta_rule``,
in XLA, differentiated by JAX's autodiff).

The kernel is picked by ``backend`` or, when it is None, by the platform the
call is lowered for (``jax.lax.platform_dependent``): ``tpu`` -> Mosaic,
``cuda`` -> Triton, anything else -> the Mosaic kernel in interpret mode
(slow; for tests and debugging on CPU).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.common import blocks as common_blocks
from pallas_kernels.common import compiler, dispatch
from pallas_kernels.common.layout import sum_parts
from pallas_kernels.delta_rule import gpu, layout, tpu
from pallas_kernels.delta_rule.block_sizes import BlockSizes
from pallas_kernels.delta_rule.chunk_step import KernelSpec

_F32 = jnp.float32


class ChunkTerms(NamedTuple):
  """The WY terms of every chunk, head-major, float32.

  With ``G_i`` the log-decay from the chunk start to token i (inclusive),
  ``A[i, j] = beta_i k_i . (exp(G_i - G_j) * k_j)`` (j < i, one document):
  """
  w: jax.Array       # [B, N, H, C, K] (I + A)^{-1} diag(beta) (exp(G) * K),
                     # rows where the entering state reaches the token
  u: jax.Array       # [B, N, H, C, V] (I + A)^{-1} diag(beta) V
  q: jax.Array       # [B, N, H, C, K] scale exp(G_i) q_i where the entering
                     # state reaches i
  scores: jax.Array  # [B, N, H, C, C] P[i, j] = scale q_i . (exp(G_i - G_j)
                     # * k_j), j <= i in one document
  k: jax.Array       # [B, N, H, C, K] exp(G_C - G_j) k_j for j in the
                     # chunk's last document
  decay: jax.Array   # [B, N, H, G] exp(G_C) where the state passes through
                     # the chunk (no document starts in it), G = 1 or K


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static settings of one call."""
  output_final_state: bool      # return the final state
  bf16_dots: bool               # bfloat16 matmul operands
  backend: str | None           # "tpu", "gpu", or None: by lowering platform
  interpret: bool               # run the kernels in interpret mode
  blocks: tuple                 # ((backend, BlockSizes), ...) per backend


def _prepare(cfg: _Config, backend: str, terms: ChunkTerms):
  blocks = dict(cfg.blocks)[backend]
  b, n, h, c, dk = terms.w.shape
  lay = layout.make_layout(b, n, h, c, dk, terms.u.shape[-1], blocks)
  return blocks, lay, KernelSpec(bf16_dots=cfg.bf16_dots, backend=backend)


def _cost(lay: layout.Layout, arrays, passes: int):
  """A cost estimate: ``passes`` times the forward sweep's products per
  chunk (``W S``, ``Q S``, ``K^T U``: ``3 C K V`` multiply-adds; ``P U``:
  ``C^2 V``)."""
  per_chunk = 2 * lay.c_pad * lay.v_pad * (3 * lay.k_pad + lay.c_pad)
  return compiler.cost(flops=lay.batch * lay.heads * lay.chunks * per_chunk
                       * passes, transcendentals=0,
                       arrays=list(arrays.values()))


def _forward_sweep(backend, blocks, arrays, spec, lay, interpret, **wanted):
  cost = _cost(lay, arrays, 1)
  if backend == "tpu":
    return tpu.forward(arrays, spec, lay, cost=cost, interpret=interpret,
                       **wanted)
  return gpu.forward(arrays, spec, lay, blocks, cost=cost,
                     interpret=interpret, **wanted)


def _forward(cfg: _Config, backend: str, interpret: bool, terms, s0):
  blocks, lay, spec = _prepare(cfg, backend, terms)
  arrays = layout.kernel_arrays(terms, s0, lay, bf16_dots=cfg.bf16_dots)
  out_dtype = jnp.bfloat16 if cfg.bf16_dots else _F32
  o, final, _ = _forward_sweep(
      backend, blocks, arrays, spec, lay, interpret, out_dtype=out_dtype,
      outputs=True, final_state=cfg.output_final_state, states=False)
  o = layout.from_kernel(o, lay.chunk, lay.dim_v)               # [B,N,H,C,V]
  return o, (None if final is None else layout.state_from_kernel(final, lay))


def _backward(cfg: _Config, backend: str, interpret: bool, terms, s0, do,
              d_final):
  blocks, lay, spec = _prepare(cfg, backend, terms)
  arrays = layout.kernel_arrays(terms, s0, lay, bf16_dots=cfg.bf16_dots)
  _, _, states = _forward_sweep(
      backend, blocks, arrays, spec, lay, interpret, out_dtype=_F32,
      outputs=False, final_state=False, states=True)
  arrays = {name: x for name, x in arrays.items() if name != "initial_state"}
  arrays["do"] = layout.to_kernel(do, lay.c_pad, lay.v_pad,
                                  arrays["u"].dtype)            # [B,H,N,C,V]
  arrays["states"] = states
  if d_final is not None:
    arrays["d_final"] = layout.state_to_kernel(d_final, lay)
  cost = _cost(lay, arrays, 2)
  if backend == "tpu":
    grads, ds0 = tpu.backward(arrays, spec, lay, d_initial=s0 is not None,
                              cost=cost, interpret=interpret)
  else:
    grads, ds0 = gpu.backward(arrays, spec, lay, blocks,
                              d_initial=s0 is not None, cost=cost,
                              interpret=interpret)
  # Parts from the programs of different value columns: [B, H, VB, N, R, F].
  parts = {name: sum_parts(jnp.moveaxis(grad, 2, 0))
           for name, grad in grads.items() if name != "u"}
  d_terms = ChunkTerms(
      w=layout.from_kernel(parts["w"], lay.chunk, lay.dim_k),
      u=layout.from_kernel(grads["u"], lay.chunk, lay.dim_v),
      q=layout.from_kernel(parts["q"], lay.chunk, lay.dim_k),
      scores=layout.from_kernel(parts["scores"], lay.chunk, lay.chunk),
      k=layout.from_kernel(parts["k"], lay.chunk, lay.dim_k),
      decay=layout.decay_from_kernel(parts["decay"], lay,
                                     terms.decay.shape[-1]))
  return d_terms, (None if ds0 is None else layout.state_from_kernel(ds0, lay))


def _dispatch(cfg: _Config, fn, *args):
  return dispatch.by_platform(cfg.backend, cfg.interpret,
                              functools.partial(fn, cfg), *args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sweep(cfg: _Config, terms: ChunkTerms, s0):
  return _dispatch(cfg, _forward, terms, s0)


def _sweep_fwd(cfg: _Config, terms: ChunkTerms, s0):
  # Only the inputs are kept: the backward pass recomputes the states.
  return _dispatch(cfg, _forward, terms, s0), (terms, s0)


def _sweep_bwd(cfg: _Config, residuals, cotangents):
  terms, s0 = residuals
  do, d_final = cotangents
  d_terms, ds0 = _dispatch(cfg, _backward, terms, s0, do, d_final)
  return d_terms, ds0


_sweep.defvjp(_sweep_fwd, _sweep_bwd)


def _check(terms: ChunkTerms, initial_state):
  shapes = {name: np.shape(x) for name, x in terms._asdict().items()}
  if len(shapes["w"]) != 5:
    raise ValueError(f"w must be [B, N, H, C, K], got {shapes['w']}")
  b, n, h, c, dk = shapes["w"]
  dv = shapes["u"][-1] if len(shapes["u"]) == 5 else None
  expected = {"w": (b, n, h, c, dk), "u": (b, n, h, c, dv),
              "q": (b, n, h, c, dk), "scores": (b, n, h, c, c),
              "k": (b, n, h, c, dk)}
  for name, shape in expected.items():
    if shapes[name] != shape:
      raise ValueError(f"{name} must be [B, N, H, C, .] = {shape} (from w "
                       f"{shapes['w']} and u {shapes['u']}), got "
                       f"{shapes[name]}")
  if shapes["decay"] not in ((b, n, h, 1), (b, n, h, dk)):
    raise ValueError(f"decay must be [B, N, H, 1] or [B, N, H, K] with "
                     f"[B, N, H, K] = {(b, n, h, dk)}, got {shapes['decay']}")
  state_shape = (b, h, dk, dv)
  if initial_state is not None and np.shape(initial_state) != state_shape:
    raise ValueError(f"initial_state must be [B, H, K, V] = {state_shape}, "
                     f"got {np.shape(initial_state)}")


def chunk_delta_rule_sweep(
    terms: ChunkTerms, *, initial_state=None, output_final_state=False,
    bf16_dots: bool = False, backend: str | None = None,
    block_sizes: BlockSizes | Sequence[BlockSizes] | None = None,
    interpret: bool = False):
  """The sweep over chunks of the delta rule, on Pallas kernels (forward and
  backward).

  Args:
    terms: ``ChunkTerms`` of every chunk, float32 (see its fields).
    initial_state: ``[B, H, K, V]`` or None (zeros); float32.
    output_final_state: also return the state after the last chunk.
    bf16_dots: bfloat16 matmul operands with float32 accumulation (for
      bfloat16 inputs); else float32 matmuls at the highest precision. The
      state is float32 either way.
    backend: "tpu" (Mosaic), "gpu" (Triton), or None: by the platform the
      call is lowered for (tpu, cuda; any other platform runs the Mosaic
      kernel in interpret mode).
    block_sizes: ``BlockSizes`` for one or more backends (speed only); the
      others take ``BlockSizes.default``.
    interpret: run the kernels of ``backend`` in interpret mode (needs an
      explicit ``backend``).
  Returns:
    ``(o [B, N, H, C, V], final_state [B, H, K, V] float32 or None)``; ``o``
    is float32, or bfloat16 with ``bf16_dots``.

  Example:
    >>> b, n, h, c, dk, dv = 1, 3, 2, 16, 8, 8
    >>> x = lambda *shape: jnp.full(shape, 0.1)
    >>> terms = ChunkTerms(w=x(b, n, h, c, dk), u=x(b, n, h, c, dv),
    ...                    q=x(b, n, h, c, dk), scores=x(b, n, h, c, c),
    ...                    k=x(b, n, h, c, dk), decay=x(b, n, h, 1))
    >>> o, s = chunk_delta_rule_sweep(terms, backend="tpu", interpret=True,
    ...                               output_final_state=True)
    >>> o.shape, s.shape
    ((1, 3, 2, 16, 8), (1, 2, 8, 8))
  """
  terms = ChunkTerms(*terms)
  _check(terms, initial_state)
  dispatch.check_call(backend, interpret)
  blocks = common_blocks.by_backend(block_sizes, BlockSizes,
                                    BlockSizes.default)
  cfg = _Config(output_final_state=bool(output_final_state),
                bf16_dots=bool(bf16_dots), backend=backend,
                interpret=bool(interpret), blocks=tuple(blocks.items()))
  terms = ChunkTerms(*(jnp.asarray(x, _F32) for x in terms))
  s0 = None if initial_state is None else jnp.asarray(initial_state, _F32)
  return _sweep(cfg, terms, s0)
