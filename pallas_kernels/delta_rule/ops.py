"""The delta rule's chunk sweep on Pallas kernels: dispatch and gradients.

The chunked delta rule (WY / UT form) has a chunk-local part, the terms
``ChunkTerms`` of every chunk (one small triangular inverse per chunk, no
dependence on the state), and a sequential part, the sweep over chunks:

    U_n = U'_n - W_n S_n,   S_{n+1} = diag(d_n) S_n + K_n^T U_n,
    o_n = Q_n S_n + P_n U_n

This module runs it (``chunk_step.py`` has the equations of the kernel
body and of the gradient):

- Forward: one sweep kernel writes the state entering every chunk and the
  pseudo-values ``U_n`` (and the final state); the outputs are then two
  batched matmuls over all chunks at once, in XLA (nothing sequential is
  left in them), as flash-linear-attention splits ``chunk_delta_h`` from
  ``chunk_o``. The sweep kernel only carries the state.
- Backward (``jax.custom_vjp``): the forward sweep again (kernel
  ``delta_rule_states``; nothing but the inputs is kept from the forward
  pass), the gradients the outputs send
  (``P^T do``, and ``dQ``, ``dP``) as batched matmuls, then the same sweep
  kernel walked from the last chunk to the first for ``dU'`` and the
  gradient of the state leaving every chunk (and of the initial state);
  ``dW``, ``dK`` and the chunk decays' gradient are batched matmuls over
  all chunks again.

The terms themselves are prepared outside (``lin_attn_jax.ops.delta_rule``,
in XLA, differentiated by JAX's autodiff).

The kernel is picked by ``backend`` or, when it is None, by the platform the
call is lowered for (``jax.lax.platform_dependent``): ``tpu`` -> Mosaic,
``cuda`` -> Triton, anything else -> the Mosaic kernel in interpret mode
(slow; for tests and debugging on CPU).

Letters: b batch, n chunk, h head, i and j (or c) rows of a chunk, k key
channel, v value channel.
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


def _prepare(cfg: _Config, backend: str, terms: ChunkTerms, *,
             extra: bool = False):
  blocks = dict(cfg.blocks)[backend]
  b, n, h, c, dk = terms.w.shape
  lay = layout.make_layout(b, n, h, c, dk, terms.u.shape[-1], blocks)
  return blocks, lay, KernelSpec(bf16_dots=cfg.bf16_dots, backend=backend,
                                 extra=extra)


def _sweep_kernel(backend, blocks, arrays, spec, lay, interpret, **options):
  """One sweep kernel; its cost: per chunk ``M1 x^T`` and ``y^T M2`` (and
  ``E_a^T E_b``), ``C K V`` multiply-adds each."""
  products = 3 if spec.extra else 2
  cost = compiler.cost(
      flops=2 * lay.batch * lay.heads * lay.chunks * lay.c_pad * lay.k_pad
      * lay.v_pad * products, transcendentals=0, arrays=list(arrays.values()))
  if backend == "tpu":
    return tpu.sweep(arrays, spec, lay, cost=cost, interpret=interpret,
                     **options)
  return gpu.sweep(arrays, spec, lay, blocks, cost=cost, interpret=interpret,
                   **options)


def _mm(subscripts, a, b, bf16: bool):
  """A float32-accumulated batched matmul: bfloat16 operands, or float32
  ones at the highest precision (as the kernels' ``chunk_step.dot``)."""
  if bf16:
    return jnp.einsum(subscripts, a.astype(jnp.bfloat16),
                      b.astype(jnp.bfloat16), preferred_element_type=_F32)
  return jnp.einsum(subscripts, a, b, precision=jax.lax.Precision.HIGHEST,
                    preferred_element_type=_F32)


def _states_and_pseudo_values(cfg: _Config, backend: str, interpret: bool,
                              terms: ChunkTerms, s0, *, final_state: bool,
                              name: str):
  """The forward sweep: ``(layout, U [B, N, H, C, V], the state entering
  each chunk X = S^T [B, H, N, V, K], final state [B, H, V_pad, K_pad] or
  None)``, float32; ``name``: the kernel's."""
  blocks, lay, spec = _prepare(cfg, backend, terms)
  dtype = jnp.bfloat16 if cfg.bf16_dots else _F32
  arrays = {"a": layout.values_to_kernel(terms.u, lay),
            "m1": layout.rows_to_kernel(-terms.w, lay, dtype),
            "m2": layout.rows_to_kernel(terms.k, lay, dtype),
            "decay": layout.decay_to_kernel(terms.decay, lay)}
  if s0 is not None:
    arrays["initial_state"] = layout.state_to_kernel(s0, lay)
  u, states, final = _sweep_kernel(
      backend, blocks, arrays, spec, lay, interpret, reverse=False,
      final_state=final_state, name=name)
  return (lay, layout.values_from_kernel(u, lay),
          layout.states_from_kernel(states, lay), final)


def _forward(cfg: _Config, backend: str, interpret: bool, terms, s0):
  lay, u, states, final = _states_and_pseudo_values(
      cfg, backend, interpret, terms, s0,
      final_state=cfg.output_final_state, name="delta_rule_forward")
  bf16 = cfg.bf16_dots
  o = (_mm("bnhck,bhnvk->bnhcv", terms.q, states, bf16)
       + _mm("bnhij,bnhjv->bnhiv", terms.scores, u, bf16))    # [B,N,H,C,V]
  o = o.astype(jnp.bfloat16 if bf16 else _F32)
  return o, (None if final is None else layout.state_from_kernel(final, lay))


def _backward(cfg: _Config, backend: str, interpret: bool, terms, s0, do,
              d_final):
  _, u, states, _ = _states_and_pseudo_values(
      cfg, backend, interpret, terms, s0, final_state=False,
      name="delta_rule_states")
  blocks, lay, spec = _prepare(cfg, backend, terms, extra=True)
  bf16 = cfg.bf16_dots
  dtype = jnp.bfloat16 if bf16 else _F32
  do = jnp.asarray(do, _F32)
  # What the outputs o = Q S + P U send back.
  dq = _mm("bnhcv,bhnvk->bnhck", do, states, bf16)            # [B,N,H,C,K]
  dscores = _mm("bnhiv,bnhjv->bnhij", do, u, bf16)            # [B,N,H,C,C]
  du_outputs = _mm("bnhij,bnhiv->bnhjv", terms.scores, do, bf16)
  arrays = {"a": layout.values_to_kernel(du_outputs, lay),
            "m1": layout.rows_to_kernel(terms.k, lay, dtype),
            "m2": layout.rows_to_kernel(-terms.w, lay, dtype),
            "decay": layout.decay_to_kernel(terms.decay, lay),
            "e_a": layout.values_to_kernel(do, lay, dtype),
            "e_b": layout.rows_to_kernel(terms.q, lay, dtype)}
  if d_final is not None:
    arrays["initial_state"] = layout.state_to_kernel(d_final, lay)
  du, d_leaving, ds0 = _sweep_kernel(
      backend, blocks, arrays, spec, lay, interpret, reverse=True,
      final_state=s0 is not None, name="delta_rule_backward")
  du = layout.values_from_kernel(du, lay)                     # [B,N,H,C,V]
  d_leaving = layout.states_from_kernel(d_leaving, lay)       # [B,H,N,V,K]
  dw = -_mm("bnhcv,bhnvk->bnhck", du, states, bf16)
  dk = _mm("bnhcv,bhnvk->bnhck", u, d_leaving, bf16)
  d_decay = jnp.einsum("bhnvk,bhnvk->bnhk", states, d_leaving,
                       precision=jax.lax.Precision.HIGHEST)   # [B,N,H,K]
  if terms.decay.shape[-1] == 1:
    d_decay = jnp.sum(d_decay, axis=-1, keepdims=True)
  d_terms = ChunkTerms(w=dw, u=du, q=dq, scores=dscores, k=dk,
                       decay=d_decay)
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
      bfloat16 inputs), in the kernels and in the batched matmuls around
      them; else float32 matmuls at the highest precision. The state is
      float32 either way.
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
