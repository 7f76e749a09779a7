"""Forgetting attention on Pallas kernels: validation, dispatch, gradients.

    o_i = sum_{j <= i, one document, i - j < window} softmax_j(scale q_i . k_j
          + c_i - c_j) v_j

with ``c`` the cumulative log forget gate of each query head (the op
computes it, restarting in every document). The blocked form is flash
attention with the bias ``c_i - c_j`` (``block_math.py``):

- Forward: one kernel, ``o`` and the row log-sum-exp ``lse``, which the
  backward pass keeps (float32 ``[B, T, H]``) with the inputs and ``o``.
- Backward (``jax.custom_vjp``): ``delta = o . do`` per token in XLA, then
  two kernels that recompute ``P`` from ``lse``: by query block ``dq`` and
  the row sums of ``dS``, by key block ``dk``, ``dv`` (summed over the query
  heads of a group) and the column sums of ``dS``;
  ``dc = rowsum(dS) - colsum(dS)``.

Blocks entirely outside the causal mask, the window or the documents are
skipped (``layout.py``), so the work grows as ``T^2 / 2`` without a window
and as ``T (window + block)`` with one, and packed documents cost only
their own pairs.

The kernel is picked by ``backend`` or, when it is None, by the platform the
call is lowered for (``pallas_kernels.common.dispatch``): ``tpu`` -> Mosaic
(``tpu.py``), ``cuda`` -> Triton (``gpu.py``), anything else -> the Mosaic
kernels in interpret mode.

Letters: b batch, t token, h query head, k key channel, v value channel.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.common import blocks as common_blocks
from pallas_kernels.common import compiler, dispatch
from pallas_kernels.forgetting_attn import block_math, gpu, layout, tpu
from pallas_kernels.forgetting_attn.block_sizes import BlockSizes

_F32 = jnp.float32
# Matmuls of float32 inputs: float32 at the highest precision on TPU, IEEE
# float32 on the GPU's CUDA cores. 3xTF32 (``common/dots.py``) holds every
# resident operand three times: its backward kernels reached 255 registers
# per thread, or spilled, at every tile size tried (16 to 64 tokens, 4 and
# 8 warps, 1 and 2 stages); IEEE float32 stays under 130 at 16 tokens.
FLOAT32_MODE = "f32"


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static settings of one call."""
  scale: float                  # query scale
  window: int | None            # visible keys: i - j < window
  segments: bool                # segment ids were given
  backend: str | None           # "tpu", "gpu", or None: by lowering platform
  interpret: bool               # run the kernels in interpret mode
  blocks: tuple                 # ((backend, BlockSizes), ...) per backend


def _setup(cfg: _Config, backend: str, q, k, v):
  """``(layout, spec, dtype of the kernels' token arrays)``."""
  bf16 = all(x.dtype == jnp.bfloat16 for x in (q, k, v))
  lay = layout.make_layout(q.shape, k.shape[2], v.shape[-1],
                           dict(cfg.blocks)[backend], bf16=bf16,
                           window=cfg.window, segments=cfg.segments)
  spec = block_math.Spec(scale=cfg.scale, window=cfg.window,
                         documents=lay.documents,
                         mode="bf16" if bf16 else FLOAT32_MODE)
  return lay, spec, jnp.bfloat16 if bf16 else _F32


def _arrays(lay: layout.Layout, dtype, q, k, v, c, doc):
  return {"q": layout.tokens_to_kernel(q, lay, lay.k_pad, dtype),
          "k": layout.tokens_to_kernel(k, lay, lay.k_pad, dtype),
          "v": layout.tokens_to_kernel(v, lay, lay.v_pad, dtype),
          "c": layout.rows_to_kernel(c, lay, edge=True),
          "doc": layout.documents_to_kernel(doc, lay)}


def _cost(lay: layout.Layout, walk: layout.Walk, arrays, *, products: int,
          exps: int):
  """A cost estimate: ``products`` matmuls of a block pair over ``K`` or
  ``V`` (counted as ``(K + V) / 2`` each) and ``exps`` exponentials per
  entry, over the block pairs of the walk that the causal mask and the
  window leave (documents not counted)."""
  pairs = int(np.sum(walk.last - walk.first + 1))
  entries = lay.batch * lay.heads * pairs * walk.own * walk.step
  flops = entries * products * (lay.k_pad + lay.v_pad)
  return compiler.cost(flops=flops, transcendentals=entries * exps,
                       arrays=[x for x in arrays if x is not None])


def _kernels(backend: str):
  return tpu if backend == "tpu" else gpu


def _forward(cfg: _Config, backend: str, interpret: bool, q, k, v, c, doc):
  lay, spec, dtype = _setup(cfg, backend, q, k, v)
  arrays = _arrays(lay, dtype, q, k, v, c, doc)
  walk = layout.key_walk(lay, lay.tiles.block_q, lay.tiles.block_k)
  o, lse = _kernels(backend).forward(
      arrays, layout.key_bounds(walk, arrays["doc"], lay), spec, lay, walk,
      cost=_cost(lay, walk, arrays.values(), products=2, exps=1),
      interpret=interpret)
  return (layout.tokens_from_kernel(o, lay, lay.heads, lay.dim_v)
          .astype(v.dtype), layout.rows_from_kernel(lse, lay))


def _backward(cfg: _Config, backend: str, interpret: bool, q, k, v, c, doc,
              o, lse, do):
  lay, spec, dtype = _setup(cfg, backend, q, k, v)
  arrays = _arrays(lay, dtype, q, k, v, c, doc)
  delta = jnp.sum(o.astype(_F32) * do.astype(_F32), axis=-1)   # [B, T, H]
  arrays.update(do=layout.tokens_to_kernel(do, lay, lay.v_pad, dtype),
                lse=layout.rows_to_kernel(lse, lay),
                delta=layout.rows_to_kernel(delta, lay))
  kernels, tiles = _kernels(backend), lay.tiles
  by_query = layout.key_walk(lay, tiles.dq_block_q, tiles.backward_block_k)
  dq, dc_rows = kernels.dq(
      arrays, layout.key_bounds(by_query, arrays["doc"], lay), spec, lay,
      by_query, cost=_cost(lay, by_query, arrays.values(), products=3,
                           exps=1), interpret=interpret)
  by_key = layout.query_walk(lay, tiles.backward_block_q,
                             tiles.backward_block_k)
  dk, dv, dc_cols = kernels.dkv(
      arrays, layout.query_bounds(by_key, arrays["doc"], lay), spec, lay,
      by_key, cost=_cost(lay, by_key, arrays.values(), products=4, exps=1),
      interpret=interpret)
  return (layout.tokens_from_kernel(dq, lay, lay.heads, lay.dim_k),
          layout.tokens_from_kernel(dk, lay, lay.kv_heads, lay.dim_k),
          layout.tokens_from_kernel(dv, lay, lay.kv_heads, lay.dim_v),
          layout.rows_from_kernel(dc_rows + dc_cols, lay))


def _dispatch(cfg: _Config, fn, *args):
  return dispatch.by_platform(cfg.backend, cfg.interpret,
                              functools.partial(fn, cfg), *args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg: _Config, q, k, v, c, doc):
  return _dispatch(cfg, _forward, q, k, v, c, doc)[0]


def _attention_fwd(cfg: _Config, q, k, v, c, doc):
  o, lse = _dispatch(cfg, _forward, q, k, v, c, doc)
  return o, (q, k, v, c, doc, o, lse)


def _attention_bwd(cfg: _Config, residuals, do):
  q, k, v, c, doc, o, lse = residuals
  dq, dk, dv, dc = _dispatch(cfg, _backward, q, k, v, c, doc, o, lse, do)
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype),
          dc.astype(c.dtype), None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def check_inputs(q, k, v, c, segment_ids, window_size):
  """Shapes and static arguments; ``ValueError`` naming the argument."""
  for name, x in (("q", q), ("k", k), ("v", v)):
    if np.ndim(x) != 4:
      raise ValueError(f"{name} must be [B, T, heads, features], got shape "
                       f"{np.shape(x)}")
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
      raise ValueError(f"{name} must be floating point, got "
                       f"{jnp.result_type(x)}")
  b, t, h, dk = np.shape(q)
  if b < 1 or t < 1:
    raise ValueError(f"q must hold at least one token, got {np.shape(q)}")
  hkv = np.shape(k)[2]
  if np.shape(k) != (b, t, hkv, dk) or hkv < 1 or h % hkv:
    raise ValueError(f"k must be [B, T, Hkv, K] with [B, T] = {(b, t)}, K = "
                     f"{dk} and H = {h} a multiple of Hkv, got {np.shape(k)}")
  if np.shape(v)[:3] != (b, t, hkv):
    raise ValueError(f"v must be [B, T, Hkv, V] with [B, T, Hkv] = "
                     f"{(b, t, hkv)}, got {np.shape(v)}")
  if np.shape(c) != (b, t, h):
    raise ValueError(f"c must be [B, T, H] = {(b, t, h)}, got {np.shape(c)}")
  if segment_ids is not None and np.shape(segment_ids) != (b, t):
    raise ValueError(f"segment_ids must be [B, T] = {(b, t)}, got "
                     f"{np.shape(segment_ids)}")
  if window_size is not None:
    common_blocks.check_positive("window_size", window_size)


def forgetting_attention(
    q, k, v, c, *, scale=None, segment_ids=None,
    window_size: int | None = None,
    block_sizes: BlockSizes | Sequence[BlockSizes] | None = None,
    backend: str | None = None, interpret: bool = False):
  """Forgetting attention (FoX) on Pallas kernels, forward and backward.

  Args:
    q: ``[B, T, H, K]`` queries; k: ``[B, T, Hkv, K]`` keys; v: ``[B, T,
      Hkv, V]`` values (H a multiple of Hkv: grouped heads). bfloat16
      inputs run bfloat16 matmul operands with float32 accumulation; any
      other float dtype runs in float32 (TPU: highest precision, GPU:
      IEEE float32).
    c: ``[B, T, H]`` float32, the cumulative log forget gate of every query
      head, ``c_t = sum_{l <= t} log f_l`` (restarting per document, or
      not: only differences within a document enter).
    scale: the query scale (a Python float), ``K ** -0.5`` when None.
    segment_ids: ``[B, T]`` ints; a document is a run of equal ids, and a
      query sees only its own document's keys.
    window_size: a query ``i`` sees the keys ``j > i - window_size`` (None:
      all earlier keys).
    block_sizes: ``BlockSizes`` for one or more backends (speed only); the
      others take ``BlockSizes.default``.
    backend: "tpu" (Mosaic), "gpu" (Triton), or None: by the platform the
      call is lowered for (tpu, cuda; any other platform runs the Mosaic
      kernels in interpret mode).
    interpret: run the kernels of ``backend`` in interpret mode (needs an
      explicit ``backend``).
  Returns:
    ``o [B, T, H, V]`` in ``v``'s dtype. Differentiable in q, k, v and c
    (``jax.custom_vjp``; the backward pass keeps the inputs, ``o`` and the
    float32 log-sum-exp of every query).

  Example:
    >>> b, t, h, dk = 1, 20, 2, 8
    >>> q = k = v = jnp.full((b, t, h, dk), 0.1)
    >>> c = jnp.cumsum(jnp.full((b, t, h), -0.1), axis=1)
    >>> forgetting_attention(q, k, v, c, backend="tpu",
    ...                      interpret=True).shape
    (1, 20, 2, 8)
  """
  check_inputs(q, k, v, c, segment_ids, window_size)
  dispatch.check_call(backend, interpret)
  blocks = common_blocks.by_backend(block_sizes, BlockSizes,
                                    BlockSizes.default)
  dk = np.shape(q)[3]
  try:
    scale = float(dk ** -0.5 if scale is None else scale)
  except (TypeError, jax.errors.ConcretizationTypeError) as e:
    raise ValueError(f"scale must be a Python float, got {scale!r}") from e
  cfg = _Config(scale=scale, window=window_size,
                segments=segment_ids is not None, backend=backend,
                interpret=bool(interpret), blocks=tuple(blocks.items()))
  doc = (None if segment_ids is None
         else layout.document_index(segment_ids).astype(_F32))
  return _attention(cfg, q, k, v, jnp.asarray(c, _F32), doc)
