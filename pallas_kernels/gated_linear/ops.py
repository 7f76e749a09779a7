"""Chunked gated linear attention on Pallas kernels: dispatch and gradients.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T (scale q_t)

GPU (``gpu.py``, chunk-parallel): forward, the state sweep then the outputs
of every chunk at once; backward (``jax.custom_vjp``), the state sweep
again, the reverse sweep for the states' gradients, then the gradients of
every chunk at once. XLA adds up the log-decays' gradient terms inside each
chunk (``gpu.gate_gradient``).

TPU (``tpu_chunks.py``): the GPU's split with Mosaic bodies, forward a
states sweep then the outputs of every chunk at once; backward the states
sweep again, the reverse sweep, then the gradients of every chunk at once.

TPU with ``BlockSizes(chunk_parallel=False)`` (``tpu.py``, a sweep over
sub-chunks):

- Forward: one kernel, outputs and the final state.
- Backward: two kernels that recompute the states instead of storing them:
  a forward sweep for ``dq`` (which also writes the state entering each
  chunk, with a decay) and a reverse sweep for ``dk``, ``dv`` and the
  initial state's gradient. Both also return terms of the log-decays'
  gradient, which ``gate_gradient`` adds up with cumulative sums inside
  each sub-chunk in plain XLA: elementwise work over ``[B, T, H, G]``, no
  kernel.

TPU programs own blocks of key and value columns (``layout.Tiles``); the
parts they return of sums over key or value channels are added here.

The kernel is picked by ``backend`` or, when it is None, by the platform the
call is lowered for (``pallas_kernels.common.dispatch``).
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
from pallas_kernels.common.layout import sum_parts
from pallas_kernels.gated_linear import (chunk_math, gpu, layout, tpu,
                                         tpu_chunks)
from pallas_kernels.gated_linear.block_sizes import BlockSizes
from pallas_kernels.gated_linear.sub_chunk import KernelSpec

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static settings of one call."""
  scale: float                  # query scale
  output_final_state: bool      # return the final state
  backend: str | None           # "tpu", "gpu", or None: by lowering platform
  interpret: bool               # run the kernels in interpret mode
  blocks: tuple                 # ((backend, BlockSizes), ...) per backend


def _prepare(cfg: _Config, backend, q, k, v, g, doc):
  blocks = dict(cfg.blocks)[backend]
  b, t, h, dk = q.shape
  lay = layout.make_layout(b, t, h, dk, v.shape[-1], blocks)
  bf16 = all(x.dtype == jnp.bfloat16 for x in (q, k, v))
  spec = KernelSpec(gate=chunk_math.gate_kind(g),
                    segments=doc is not None,
                    scale=cfg.scale, sub_chunk=lay.sub_chunk, bf16_dots=bf16)
  return blocks, lay, spec, bf16


def _cost(spec: KernelSpec, lay: layout.Layout, arrays, passes: int):
  """A cost estimate of one kernel: ``passes`` times the forward pass's
  work (the state product and update, ``2 K V`` multiply-adds per token,
  and the ``[c, c]`` scores and their product with the values)."""
  tokens = lay.batch * lay.heads * lay.t_pad
  k, v, c = lay.k_pad, lay.v_pad, lay.sub_chunk
  flops = 2 * tokens * (2 * k * v + c * (k + v)) * passes
  exps = {"none": 0, "scalar": c, "channel": c * k}[spec.gate]
  return compiler.cost(flops=flops, transcendentals=tokens * exps * passes,
                       arrays=list(arrays.values()))


def _gpu_states(arrays, spec, lay, s0, *, final, interpret):
  """The forward sweep; its states in the matmul operands' dtype."""
  state_in = None if s0 is None else gpu.pad_state(s0, lay)
  return gpu.sweep(arrays, spec, lay, reverse=False,
                   state_in=state_in, state_out=final,
                   states_dtype=arrays["k"].dtype,
                   cost=gpu.cost(spec, lay, "sweep", arrays.values()),
                   interpret=interpret)


def _gpu_forward(cfg: _Config, interpret: bool, q, k, v, g, s0, doc):
  lay, spec = gpu.setup(q, k, v, g, doc, dict(cfg.blocks)["gpu"], cfg.scale)
  arrays = gpu.prepare(q, k, v, g, doc, lay, spec)
  swept = _gpu_states(arrays, spec, lay, s0,
                      final=cfg.output_final_state, interpret=interpret)
  o = gpu.outputs(arrays, swept["states"], spec, lay,
                  out_dtype=arrays["v"].dtype,
                  cost=gpu.cost(spec, lay, "outputs", arrays.values()),
                  interpret=interpret)
  o = o[:, :lay.length, :, :lay.dim_v].astype(v.dtype)
  final = swept.get("state_out")
  return o, (None if final is None
             else final[:, :, :lay.dim_k, :lay.dim_v])


def _gpu_backward(cfg: _Config, interpret: bool, q, k, v, g, s0, doc, do,
                  d_final):
  lay, spec = gpu.setup(q, k, v, g, doc, dict(cfg.blocks)["gpu"], cfg.scale,
                        "backward")
  arrays = gpu.prepare(q, k, v, g, doc, lay, spec, do=do)
  h = _gpu_states(arrays, spec, lay, s0, final=False,
                  interpret=interpret)["states"]
  d_in = None if d_final is None else gpu.pad_state(d_final, lay)
  swept = gpu.sweep(arrays, spec, lay, reverse=True, state_in=d_in,
                    state_out=s0 is not None, states_dtype=h.dtype,
                    cost=gpu.cost(spec, lay, "sweep", arrays.values()),
                    interpret=interpret)
  out = gpu.grads(arrays, h, swept["states"], spec, lay,
                  interpret=interpret)
  dg = None
  if g is not None:
    dg = chunk_gate_gradient(out["gate_rows"], out["gate_writes"],
                             spec.gate, lay)
  ds0 = swept.get("state_out")

  def cut(x, width):
    # float32, as the TPU kernels return them (``lax.platform_dependent``
    # traces both); the custom VJP casts them to the inputs' dtypes.
    return x[:, :lay.length, :, :width].astype(_F32)

  return (cut(out["dq"], lay.dim_k), cut(out["dk"], lay.dim_k),
          cut(out["dv"], lay.dim_v), dg,
          None if ds0 is None else ds0[:, :, :lay.dim_k, :lay.dim_v])


def chunk_gate_gradient(rows, writes, gate: str, lay):
  """The log-decays' gradient ``[B, T, H, 1 | K]`` from the chunk-parallel
  kernels' terms ``[B, T_pad, H(, K_pad)]`` (``gpu.gate_gradient``)."""
  dg = gpu.gate_gradient(rows, writes, lay.chunk)[:, :lay.length]
  return dg[..., None] if gate == "scalar" else dg[..., :lay.dim_k]


def _tpu_chunks(cfg: _Config) -> bool:
  return dict(cfg.blocks)["tpu"].tpu_chunk_parallel()


def _chunks_forward(cfg: _Config, interpret: bool, q, k, v, g, s0, doc):
  lay, spec = tpu_chunks.setup(q, k, v, g, doc, dict(cfg.blocks)["tpu"],
                               cfg.scale)
  arrays = tpu_chunks.prepare(q, k, v, g, doc, lay, spec)
  state_in = None if s0 is None else layout.state_to_kernel(s0, lay)
  swept = tpu_chunks.sweep(arrays, spec, lay, reverse=False,
                           state_in=state_in,
                           state_out=cfg.output_final_state,
                           interpret=interpret)
  o = tpu_chunks.outputs(arrays, swept["states"], spec, lay,
                         out_dtype=jnp.bfloat16 if spec.bf16 else _F32,
                         interpret=interpret)
  o = layout.from_kernel(o, lay, lay.dim_v).astype(v.dtype)
  final = swept.get("state_out")
  return o, (None if final is None else layout.state_from_kernel(final, lay))


def _chunks_backward(cfg: _Config, interpret: bool, q, k, v, g, s0, doc, do,
                     d_final):
  blocks = dict(cfg.blocks)["tpu"]
  lay, spec = tpu_chunks.setup(q, k, v, g, doc, blocks, cfg.scale)
  arrays = tpu_chunks.prepare(q, k, v, g, doc, lay, spec, do=do)
  state_in = None if s0 is None else layout.state_to_kernel(s0, lay)
  h = tpu_chunks.sweep(arrays, spec, lay, reverse=False, state_in=state_in,
                       state_out=False, interpret=interpret)["states"]
  back = tpu_chunks.make_layout(*q.shape, v.shape[-1], blocks, "backward",
                                bf16=spec.bf16)
  d_in = None if d_final is None else layout.state_to_kernel(d_final, lay)
  swept = tpu_chunks.sweep(arrays, spec, back, reverse=True, state_in=d_in,
                           state_out=s0 is not None, interpret=interpret)
  out = tpu_chunks.grads(arrays, h, swept["states"], spec, lay,
                         interpret=interpret)
  dg = None
  if g is not None:
    dg = chunk_gate_gradient(*tpu_chunks.gate_terms(out, lay), spec.gate, lay)
  ds0 = swept.get("state_out")

  def cut(x, width):
    return layout.from_kernel(x, lay, width).astype(_F32)

  return (cut(out["dq"], lay.dim_k), cut(out["dk"], lay.dim_k),
          cut(out["dv"], lay.dim_v), dg,
          None if ds0 is None else layout.state_from_kernel(ds0, lay))


def _forward(cfg: _Config, backend: str, interpret: bool, q, k, v, g, s0,
             doc):
  if backend == "gpu":
    return _gpu_forward(cfg, interpret, q, k, v, g, s0, doc)
  if _tpu_chunks(cfg):
    return _chunks_forward(cfg, interpret, q, k, v, g, s0, doc)
  blocks, lay, spec, bf16 = _prepare(cfg, backend, q, k, v, g, doc)
  arrays = layout.kernel_arrays(q, k, v, g, s0, doc, lay, bf16_dots=bf16)
  kwargs = dict(out_dtype=jnp.bfloat16 if bf16 else _F32,
                final_state=cfg.output_final_state,
                cost=_cost(spec, lay, arrays, 1), interpret=interpret)
  outs = tpu.forward(arrays, spec, lay, **kwargs)
  o = layout.from_kernel(sum_parts(outs["o"]), lay, lay.dim_v).astype(v.dtype)
  final = outs.get("final_state")
  return o, (None if final is None else layout.state_from_kernel(final, lay))


def _backward(cfg: _Config, backend: str, interpret: bool, q, k, v, g, s0,
              doc, do, d_final):
  if backend == "gpu":
    return _gpu_backward(cfg, interpret, q, k, v, g, s0, doc, do, d_final)
  if _tpu_chunks(cfg):
    return _chunks_backward(cfg, interpret, q, k, v, g, s0, doc, do, d_final)
  blocks, lay, spec, bf16 = _prepare(cfg, backend, q, k, v, g, doc)
  arrays = layout.kernel_arrays(q, k, v, g, s0, doc, lay, bf16_dots=bf16,
                                do=do)
  outs = tpu.dq(arrays, spec, lay, cost=_cost(spec, lay, arrays, 2),
                interpret=interpret)
  if d_final is not None:
    arrays["d_final"] = layout.state_to_kernel(d_final, lay)
  if "checkpoints" in outs:
    arrays["checkpoints"] = outs["checkpoints"]
  grads = tpu.dkv(arrays, spec, lay, d_initial=s0 is not None,
                  cost=_cost(spec, lay, arrays, 3), interpret=interpret)
  grads = {name: x if name == "d_initial" else sum_parts(x)
           for name, x in grads.items()}
  dg = None
  if g is not None:
    dg = gate_gradient(sum_parts(outs["gate_q"]), grads, lay, g.shape[-1])
  ds0 = grads.get("d_initial")
  return (layout.from_kernel(sum_parts(outs["dq"]), lay, lay.dim_k),
          layout.from_kernel(grads["dk"], lay, lay.dim_k),
          layout.from_kernel(grads["dv"], lay, lay.dim_v), dg,
          None if ds0 is None else layout.state_from_kernel(ds0, lay))


def gate_gradient(gate_q, terms, lay: layout.Layout, width: int):
  """Gradient of the log-decays, ``[B, T, H, width]``, from the sweeps'
  terms (see ``sub_chunk.py``): for ``m`` in a sub-chunk,

      dg_m = sum_{i >= m} gate_q_i + sum_{j < m} gate_k_inter_j + entry_grad
             + (scalar decay) gate_pairs_m
             - (per key channel) sum_{j >= m} gate_k_intra_j

  with sums inside the sub-chunk. ``gate_q``, ``gate_k_*``: ``[B, H, T_pad,
  G]``; ``entry_grad``: ``[B, H, T_pad / c, 1, G]``; ``gate_pairs``:
  ``[B, H, T_pad / c, 1, c]``.
  """
  b, h, t_pad, g_pad = gate_q.shape
  c = lay.sub_chunk

  def sub_chunks(x):                                            # [B,H,N,c,G]
    return x.reshape(b, h, t_pad // c, c, g_pad)

  # Exclusive sum over j < m: the terms shifted down one row, then summed.
  k_before = jnp.pad(sub_chunks(terms["gate_k_inter"]),
                     ((0, 0), (0, 0), (0, 0), (1, 0), (0, 0)))[:, :, :, :-1]
  dg = (jax.lax.cumsum(sub_chunks(gate_q), axis=3, reverse=True)
        + jax.lax.cumsum(k_before, axis=3) + terms["entry_grad"])
  if "gate_pairs" in terms:
    dg = dg + jnp.swapaxes(terms["gate_pairs"], 3, 4)
  if "gate_k_intra" in terms:
    dg = dg - jax.lax.cumsum(sub_chunks(terms["gate_k_intra"]), axis=3,
                             reverse=True)
  return layout.from_kernel(dg.reshape(b, h, t_pad, g_pad), lay, width)


def _dispatch(cfg: _Config, fn, *args):
  return dispatch.by_platform(cfg.backend, cfg.interpret,
                              functools.partial(fn, cfg), *args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg: _Config, q, k, v, g, s0, doc):
  return _dispatch(cfg, _forward, q, k, v, g, s0, doc)


def _attention_fwd(cfg: _Config, q, k, v, g, s0, doc):
  # Only the inputs are kept: the backward kernels recompute the states.
  return (_dispatch(cfg, _forward, q, k, v, g, s0, doc),
          (q, k, v, g, s0, doc))


def _attention_bwd(cfg: _Config, residuals, cotangents):
  q, k, v, g, s0, doc = residuals
  do, d_final = cotangents
  dq, dk, dv, dg, ds0 = _dispatch(cfg, _backward, q, k, v, g, s0, doc, do,
                                  d_final)
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg,
          ds0, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def check_inputs(q, k, v, g, initial_state, segment_ids):
  """Shapes of the inputs of a chunked recurrence on ``[B, T, H, F]``
  arrays; ``ValueError`` naming the argument."""
  if np.ndim(q) != 4 or np.shape(k) != np.shape(q):
    raise ValueError(f"q and k must be [B, T, H, K] of one shape, got "
                     f"{np.shape(q)} and {np.shape(k)}")
  b, t, h, dk = np.shape(q)
  if np.ndim(v) != 4 or np.shape(v)[:3] != (b, t, h):
    raise ValueError(f"v must be [B, T, H, V] with [B, T, H] = {(b, t, h)}, "
                     f"got {np.shape(v)}")
  if g is not None and np.shape(g) not in ((b, t, h), (b, t, h, 1),
                                           (b, t, h, dk)):
    raise ValueError(f"g must be [B, T, H] = {(b, t, h)} (or [B, T, H, 1]) "
                     f"or [B, T, H, K] = {(b, t, h, dk)}, got {np.shape(g)}")
  state_shape = (b, h, dk, np.shape(v)[3])
  if initial_state is not None and np.shape(initial_state) != state_shape:
    raise ValueError(f"initial_state must be [B, H, K, V] = {state_shape}, "
                     f"got {np.shape(initial_state)}")
  if segment_ids is not None and np.shape(segment_ids) != (b, t):
    raise ValueError(f"segment_ids must be [B, T] = {(b, t)}, got "
                     f"{np.shape(segment_ids)}")


def document_index(segment_ids):
  """``[B, T]`` float32: the number of id changes up to and including t."""
  ids = jnp.asarray(segment_ids)
  changed = (ids[:, 1:] != ids[:, :-1]).astype(_F32)
  return jnp.cumsum(jnp.pad(changed, ((0, 0), (1, 0))), axis=1)


def chunk_gated_linear_attention(
    q, k, v, g=None, *, scale=None, initial_state=None,
    output_final_state=False, segment_ids=None, chunk_size: int | None = None,
    backend: str | None = None,
    block_sizes: BlockSizes | Sequence[BlockSizes] | None = None,
    interpret: bool = False):
  """Gated linear attention, chunked, on Pallas kernels (forward and backward).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; float32 or bfloat16 (other
      float dtypes are computed in float32).
    g: natural-log decay ``<= 0``: ``[B, T, H]`` or ``[B, T, H, 1]``
      (scalar per head), ``[B, T, H, K]`` (per key channel), or None (no decay).
    scale: query scale (a Python float), ``K ** -0.5`` when None.
    initial_state: ``[B, H, K, V]`` or None (zeros); float32.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int; the state resets where the id changes.
    chunk_size: tokens per chunk (the op's or layer's chunk length; speed
      only): the default blocks' chunk, rounded up to whole 16-token tiles.
      None: ``BlockSizes.default``'s own.
    backend: "tpu" (Mosaic), "gpu" (Triton), or None: by the platform the
      call is lowered for (tpu, cuda; any other platform runs the Mosaic
      kernel in interpret mode).
    block_sizes: ``BlockSizes`` for one or more backends (speed only); the
      others take ``BlockSizes.default`` (with ``chunk_size``).
    interpret: run the kernels of ``backend`` in interpret mode (needs an
      explicit ``backend``).
  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state [B, H, K, V] float32 or
    None)``.

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2, 16), -0.1)
    >>> o, s = chunk_gated_linear_attention(q, k, v, g, backend="tpu",
    ...                                     interpret=True,
    ...                                     output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 2, 32), (1, 2, 16, 32))
  """
  check_inputs(q, k, v, g, initial_state, segment_ids)
  dispatch.check_call(backend, interpret)
  b, t, h, dk = np.shape(q)
  if g is not None:
    g = jnp.asarray(g, _F32)
    g = g[..., None] if g.ndim == 3 else g
  per_channel = g is not None and g.shape[-1] != 1
  blocks = common_blocks.by_backend(
      block_sizes, BlockSizes, functools.partial(
          BlockSizes.default, per_channel=per_channel, chunk_size=chunk_size))
  cfg = _Config(scale=float(dk ** -0.5 if scale is None else scale),
                output_final_state=bool(output_final_state), backend=backend,
                interpret=bool(interpret), blocks=tuple(blocks.items()))
  if not all(jnp.issubdtype(jnp.result_type(x), jnp.floating)
             for x in (q, k, v)):
    raise ValueError("q, k and v must have floating dtypes")
  s0 = None if initial_state is None else jnp.asarray(initial_state, _F32)
  doc = None if segment_ids is None else document_index(segment_ids)
  return _attention(cfg, q, k, v, g, s0, doc)
