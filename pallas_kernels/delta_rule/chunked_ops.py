"""The delta rule on chunk-parallel kernels, GPU (Triton) and TPU (Mosaic):
forward, backward, dispatch.

    S_t = (I - b_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T,
    o_t = S_t^T (scale q_t)

Forward (``gpu_chunks.py``, ``tpu_chunks.py``): ``W`` and ``U'`` of every
chunk, the sweep for
the states entering each chunk and the pseudo-values ``U``, then the
outputs of every chunk with ``gated_linear``'s kernel on the values ``U``.

Backward (``jax.custom_vjp``; only the inputs are kept): ``W``, ``U'``, the
states and ``U`` again; the part of ``U``'s gradient from its own chunk
(``gated_linear``'s ``dv`` kernel); the reverse sweep for the gradients of
the states and of ``U``; ``dq``, ``dk``, ``dW`` and the log-decays' terms
of every chunk (``gated_linear``'s ``dq``/``dk`` kernel on the values
``U``); then what ``W`` and ``U'`` send back to ``k``, ``v``, ``beta`` and
the log-decays. XLA adds the log-decays' terms up inside each chunk.

q and k are per value head (grouped heads expanded, L2-normalised where
the op does so, by the caller).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.common import dispatch
from pallas_kernels.common.layout import power_of_two_at_least_16
from pallas_kernels.delta_rule import gpu_chunks
from pallas_kernels.delta_rule import tpu_chunks
from pallas_kernels.gated_linear import BlockSizes
from pallas_kernels.gated_linear import gpu as gl
from pallas_kernels.gated_linear import layout as tpu_layout
from pallas_kernels.gated_linear import tpu_chunks as tc
from pallas_kernels.gated_linear.ops import (check_inputs,
                                             chunk_gate_gradient,
                                             document_index)

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class _Config:
  scale: float
  output_final_state: bool
  blocks: BlockSizes            # of the backend
  interpret: bool
  backend: str = "gpu"          # "gpu" (Triton) or "tpu" (Mosaic)


# Chunks of the delta rule's chunk kernels, by the inputs' dtype, the gate
# and the padded key width. bfloat16: 64 tokens (a Hopper wgmma's 64 rows
# per warpgroup, so every chunk kernel with matmuls runs wgmma on sm_90)
# and 16 key or value columns per step, at every width: the sweeps walk
# the state by 64-row key blocks from precomputed operands
# (``gpu_chunks.sweep_layout``) and the WY gradient is two kernels on the
# ``T`` and ``A_k`` that the WY kernel keeps, which is what keeps 64-token
# chunks within the registers and shared memory of sm_80 and sm_90 at K
# and V up to 512 and 1024. A decay per key channel (KDA) at K <= 128
# takes 64-token chunks on Hopper (sm_90 and later, ``wgmma`` in every
# kernel) and 32 on earlier GPUs or when the generation is unknown
# (``mma`` only; ``dispatch.cuda_capability``): at 64, ptxas spills on
# sm_80 in ``gated_linear``'s dq/dk kernel (108 bytes) and in the WY
# gradient's keys' kernel (4 bytes) at K = V = 128, while sm_90, and K =
# 256 on both, compile without a spill. float32: 16 tokens and 32
# columns. 8 warps: the settings that compile without a register spill at
# the checked shapes (``make compile-check``). In float32 the sweeps'
# ``[K, BV]`` state spills past 128 key rows, so the op runs float32
# inputs on the sweep kernels of ``ops.py`` instead
# (``lin_attn_jax.ops.delta_rule``).
BF16_CHUNK = 64
BF16_CHUNK_BLOCK = 16
NARROW_CHANNEL_CHUNK = 32   # bfloat16, per-channel decay, K <= the width
NARROW_CHANNEL_WIDTH = 128
FLOAT32_CHUNK = 16
FLOAT32_CHUNK_BLOCK = 32
NUM_WARPS = 8


def _setup(cfg: _Config, q, k, v, g, doc):
  bf16 = all(x.dtype == jnp.bfloat16 for x in (q, k, v))
  max_chunk, block = ((BF16_CHUNK, BF16_CHUNK_BLOCK) if bf16
                      else (FLOAT32_CHUNK, FLOAT32_CHUNK_BLOCK))
  if cfg.blocks.per_channel:
    block = 16
    hopper = (dispatch.cuda_capability() or (0, 0)) >= (9, 0)
    if bf16 and not hopper and power_of_two_at_least_16(q.shape[-1]) <= (
        NARROW_CHANNEL_WIDTH):
      max_chunk = NARROW_CHANNEL_CHUNK
  blocks = dataclasses.replace(
      cfg.blocks, chunk=min(cfg.blocks.chunk, max_chunk),
      num_warps=cfg.blocks.num_warps or NUM_WARPS,
      chunk_block=cfg.blocks.chunk_block or block)
  return gl.setup(q, k, v, g, doc, blocks, cfg.scale)


def _states(arrays, spec, lay, s0, *, final, reads, interpret):
  """``(W, sweep operands, {"states", "u", "state_out"})``: the WY terms
  and the sweeps' operands (with ``reads``, the queries' too), then the
  sweep (states in the matmul operands' dtype)."""
  wu = gpu_chunks.wy(arrays, spec, lay, keep=reads, interpret=interpret)
  ops = gpu_chunks.sweep_operands(arrays, spec, lay, reads=reads,
                                  interpret=interpret)
  swept = gpu_chunks.delta_sweep(
      arrays, wu["w"], wu["u"], ops["kw"], spec, lay,
      state_in=None if s0 is None else gl.pad_state(s0, lay),
      state_out=final, states_dtype=arrays["k"].dtype,
      interpret=interpret)
  return wu, ops, swept


def _forward(cfg: _Config, q, k, v, beta, g, s0, doc):
  lay, spec = _setup(cfg, q, k, v, g, doc)
  arrays = gl.prepare(q, k, v, g, doc, lay, spec)
  arrays["beta"] = gpu_chunks.beta_to_kernel(beta, lay)
  _, _, swept = _states(arrays, spec, lay, s0,
                        final=cfg.output_final_state, reads=False,
                        interpret=cfg.interpret)
  o = gl.outputs({**arrays, "v": swept["u"]}, swept["states"], spec, lay,
                 out_dtype=arrays["v"].dtype,
                 cost=gl.cost(spec, lay, "outputs", arrays.values()),
                 interpret=cfg.interpret)
  o = o[:, :lay.length, :, :lay.dim_v].astype(v.dtype)
  final = swept.get("state_out")
  return o, (None if final is None
             else final[:, :, :lay.dim_k, :lay.dim_v])


def _backward(cfg: _Config, q, k, v, beta, g, s0, doc, do, d_final):
  lay, spec = _setup(cfg, q, k, v, g, doc)
  arrays = gl.prepare(q, k, v, g, doc, lay, spec, do=do)
  arrays["beta"] = gpu_chunks.beta_to_kernel(beta, lay)
  wu, ops, swept = _states(arrays, spec, lay, s0, final=False, reads=True,
                          interpret=cfg.interpret)
  on_u = {**arrays, "v": swept["u"]}
  du_intra = gl.dv_intra(on_u, spec, lay, interpret=cfg.interpret)["dv"]
  back = gpu_chunks.delta_sweep_grads(
      arrays, wu["w"], du_intra, ops["kw"], ops["qr"], spec, lay,
      state_in=None if d_final is None else gl.pad_state(d_final, lay),
      state_out=s0 is not None, states_dtype=swept["states"].dtype,
      interpret=cfg.interpret)
  grads = gl.grads(on_u, swept["states"], back["states"], spec, lay,
                   interpret=cfg.interpret, du=back["du"])
  wy = gpu_chunks.wy_grads(arrays, wu, grads["dw"], back["du"], spec, lay,
                           interpret=cfg.interpret)
  t, dk_, dv_ = lay.length, lay.dim_k, lay.dim_v
  dg = None
  if g is not None:
    dg = chunk_gate_gradient(grads["gate_rows"] + wy["gate_rows"],
                             grads["gate_writes"], spec.gate, lay)
  ds0 = back.get("state_out")
  return (grads["dq"][:, :t, :, :dk_].astype(_F32),
          (grads["dk"] + wy["dk"])[:, :t, :, :dk_],
          wy["dv"][:, :t, :, :dv_], wy["dbeta"][:, :t], dg,
          None if ds0 is None else ds0[:, :, :dk_, :dv_])


def _tpu_setup(cfg: _Config, q, k, v, beta, g, doc, do=None):
  lay, spec = tc.setup(q, k, v, g, doc, cfg.blocks, cfg.scale)
  arrays = tc.prepare(q, k, v, g, doc, lay, spec, do=do)
  arrays["beta"] = tpu_chunks.beta_to_kernel(beta, lay)
  return lay, spec, arrays


def _tpu_states(arrays, spec, lay, s0, *, final, interpret):
  """``(W, {"states", "u", "state_out"})`` on TPU."""
  wu = tpu_chunks.wy(arrays, spec, lay, interpret=interpret)
  swept = tpu_chunks.delta_sweep(
      arrays, wu["w"], wu["u"], spec, lay,
      state_in=None if s0 is None else tpu_layout.state_to_kernel(s0, lay),
      state_out=final, interpret=interpret)
  return wu["w"], swept


def _tpu_forward(cfg: _Config, q, k, v, beta, g, s0, doc):
  lay, spec, arrays = _tpu_setup(cfg, q, k, v, beta, g, doc)
  _, swept = _tpu_states(arrays, spec, lay, s0,
                         final=cfg.output_final_state,
                         interpret=cfg.interpret)
  o = tc.outputs({**arrays, "v": swept["u"]}, swept["states"], spec, lay,
                 out_dtype=tc.operand_dtype(spec), interpret=cfg.interpret)
  o = tpu_layout.from_kernel(o, lay, lay.dim_v).astype(v.dtype)
  final = swept.get("state_out")
  return o, (None if final is None
             else tpu_layout.state_from_kernel(final, lay))


def _tpu_backward(cfg: _Config, q, k, v, beta, g, s0, doc, do, d_final):
  lay, spec, arrays = _tpu_setup(cfg, q, k, v, beta, g, doc, do=do)
  w, swept = _tpu_states(arrays, spec, lay, s0, final=False,
                         interpret=cfg.interpret)
  on_u = {**arrays, "v": swept["u"]}
  du_intra = tc.dv_intra(arrays, spec, lay, interpret=cfg.interpret)
  back = tpu_chunks.delta_sweep_grads(
      arrays, w, du_intra, spec, lay,
      state_in=(None if d_final is None
                else tpu_layout.state_to_kernel(d_final, lay)),
      state_out=s0 is not None, interpret=cfg.interpret)
  grads = tc.grads(on_u, swept["states"], back["states"], spec, lay,
                   interpret=cfg.interpret, du=back["du"])
  wy = tpu_chunks.wy_grads(arrays, grads["dw"], back["du"], spec, lay,
                           interpret=cfg.interpret)
  dg = None
  if g is not None:
    rows, writes = tc.gate_terms(grads, lay)
    dg = chunk_gate_gradient(rows + tc.gate_rows(wy, lay), writes,
                             spec.gate, lay)
  ds0 = back.get("state_out")

  def cut(x, width):
    return tpu_layout.from_kernel(x, lay, width)

  return (cut(grads["dq"], lay.dim_k),
          cut(grads["dk"] + wy["dk"], lay.dim_k), cut(wy["dv"], lay.dim_v),
          cut(wy["dbeta"], 1)[..., 0], dg,
          None if ds0 is None else tpu_layout.state_from_kernel(ds0, lay))


def _primal(cfg: _Config, q, k, v, beta, g, s0, doc):
  forward = _tpu_forward if cfg.backend == "tpu" else _forward
  return forward(cfg, q, k, v, beta, g, s0, doc)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg: _Config, q, k, v, beta, g, s0, doc):
  return _primal(cfg, q, k, v, beta, g, s0, doc)


def _attention_fwd(cfg: _Config, q, k, v, beta, g, s0, doc):
  return (_primal(cfg, q, k, v, beta, g, s0, doc),
          (q, k, v, beta, g, s0, doc))


def _attention_bwd(cfg: _Config, residuals, cotangents):
  q, k, v, beta, g, s0, doc = residuals
  do, d_final = cotangents
  backward = _tpu_backward if cfg.backend == "tpu" else _backward
  dq, dk, dv, dbeta, dg, ds0 = backward(cfg, q, k, v, beta, g, s0, doc, do,
                                        d_final)
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype),
          dbeta.astype(beta.dtype), dg, ds0, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def chunk_delta_rule_gpu(q, k, v, beta, g=None, *, scale=None,
                         initial_state=None, output_final_state=False,
                         segment_ids=None, chunk_size: int | None = None,
                         block_sizes: BlockSizes | None = None,
                         interpret: bool = False):
  """The delta rule on chunk-parallel Triton kernels (forward and backward).

  Args:
    q, k: ``[B, T, H, K]`` (per value head); v: ``[B, T, H, V]``; float32
      or bfloat16.
    beta: ``[B, T, H]`` writing strength.
    g: natural-log decay ``<= 0``: ``[B, T, H]`` or ``[B, T, H, 1]`` (Gated
      DeltaNet), ``[B, T, H, K]`` (KDA), or None (DeltaNet).
    scale: query scale (a Python float), ``K ** -0.5`` when None.
    initial_state: ``[B, H, K, V]`` or None (zeros); float32.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int; the state resets where the id changes.
    chunk_size: at most this many tokens per chunk (speed only;
      ``BlockSizes.gpu_settings`` caps it).
    block_sizes: GPU ``BlockSizes`` of ``pallas_kernels.gated_linear``
      (speed only).
    interpret: run the kernels in interpret mode (on any machine).
  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state [B, H, K, V] float32 or
    None)``.
  """
  return _chunk_delta_rule("gpu", q, k, v, beta, g, scale=scale,
                           initial_state=initial_state,
                           output_final_state=output_final_state,
                           segment_ids=segment_ids, chunk_size=chunk_size,
                           block_sizes=block_sizes, interpret=interpret)


def chunk_delta_rule_tpu(q, k, v, beta, g=None, *, scale=None,
                         initial_state=None, output_final_state=False,
                         segment_ids=None, chunk_size: int | None = None,
                         block_sizes: BlockSizes | None = None,
                         interpret: bool = False):
  """The delta rule on chunk-parallel Mosaic kernels (forward and
  backward): ``chunk_delta_rule_gpu``'s arguments and results, with TPU
  ``BlockSizes`` of ``pallas_kernels.gated_linear`` (the chunk: 128 tokens
  by default, at most 256, and 128 for float32 inputs) and float32 or
  bfloat16 inputs alike (float32 ones run float32 matmuls at the highest
  precision)."""
  return _chunk_delta_rule("tpu", q, k, v, beta, g, scale=scale,
                           initial_state=initial_state,
                           output_final_state=output_final_state,
                           segment_ids=segment_ids, chunk_size=chunk_size,
                           block_sizes=block_sizes, interpret=interpret)


def _chunk_delta_rule(backend, q, k, v, beta, g, *, scale, initial_state,
                      output_final_state, segment_ids, chunk_size,
                      block_sizes, interpret):
  check_inputs(q, k, v, g, initial_state, segment_ids)
  b, t, h, dk = np.shape(q)
  if np.shape(beta) != (b, t, h):
    raise ValueError(f"beta must be [B, T, H] = {(b, t, h)}, got "
                     f"{np.shape(beta)}")
  if g is not None:
    g = jnp.asarray(g, _F32)
    g = g[..., None] if g.ndim == 3 else g
  if block_sizes is None:
    block_sizes = BlockSizes.default(
        backend, per_channel=g is not None and g.shape[-1] != 1,
        chunk_size=chunk_size)
  elif block_sizes.backend != backend:
    raise ValueError(f"block_sizes are for {block_sizes.backend!r}, not "
                     f"{backend!r}")
  cfg = _Config(scale=float(dk ** -0.5 if scale is None else scale),
                output_final_state=bool(output_final_state),
                blocks=block_sizes, interpret=bool(interpret),
                backend=backend)
  s0 = None if initial_state is None else jnp.asarray(initial_state, _F32)
  doc = None if segment_ids is None else document_index(segment_ids)
  return _attention(cfg, q, k, v, jnp.asarray(beta, _F32), g, s0, doc)
