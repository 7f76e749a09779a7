"""Chunk-parallel Triton (GPU) kernels of the delta rule.

    S_t = (I - b_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T,
    o_t = S_t^T (scale q_t)

In a chunk, with ``P`` the gates' prefix sums from its start (as in
``pallas_kernels.gated_linear.chunk_math``), the WY form
(``lin_attn_jax/ops/delta_rule/README.md``) gives the pseudo-values
``U = U' - W h_n`` of the state ``h_n`` entering the chunk, with

    A[i, j] = b_i k_i . (exp(P_i - P_j) k_j)      (j < i, one document)
    T = (I + A)^{-1},  W = T (b read exp(P) k),  U' = T (b v)

and then the chunk is exactly gated linear attention on the values ``U``:
``h_{n+1} = carry exp(P_L) h_n + (write exp(P_L - P) k)^T U`` and the
outputs of ``gated_linear``'s chunk kernels with ``v := U``. The kernels
here, as flash-linear-attention splits its ``chunk_gated_delta_rule``:

- ``wy`` (grid ``(B, H, N)``): ``A``, its inverse, ``W`` and ``U'`` of
  every chunk at once. The inverse is the recursive 2 x 2 block formula,
  level by level over the halving levels of ``chunk_math``: with ``T_s``
  block-diagonal in blocks of ``s`` tokens, ``T_2s = T_s - T_s (A masked to
  level s) T_s`` (the lower-left block of ``[[L11, 0], [L21, L22]]^{-1}``
  is ``-L22^{-1} L21 L11^{-1}``), every product ``[C, C] x [C, C]`` (64
  rows at 64-token chunks: wgmma on sm_90). Its matmuls are 3xTF32 for
  float32 inputs (float32 accuracy) and TF32 for bfloat16 ones, whose ``T``
  is then rounded to a bfloat16 operand of ``W`` and ``U'`` (TF32's
  10-bit mantissa is finer than that rounding; 3xTF32's split operands
  spilled registers at 64-token chunks).
- ``sweep_operands`` (grid ``(B, H, N)``): the sweeps' operands of every
  chunk, ``kw = write exp(P_L - P) k`` and ``qr = scale read exp(P) q``
  (float32 products rounded to the sweeps' operand dtype), so that no
  ``[C, K]`` float32 tile of gates is formed inside the sweeps' loops
  (with a decay per key channel those spilled registers at 64-token
  chunks). The sweeps read only the gates' last row of each chunk, for
  the carried decay.
- ``delta_sweep`` (grid ``(B, H, V / BV)``): the sequential pass. A program
  owns the float32 state's value columns ``[K, BV]`` (all key rows: ``W
  h`` sums over them), held as key blocks of ``SWEEP_BLOCK_K`` = 64 rows
  (a ``wgmma``'s 64 rows for the update ``kw^T U``), and per chunk writes
  ``h_n``, then ``U = U' - sum_b W_b h_b`` over the key blocks and each
  block's update (``sweep_layout``: value columns, warps, pipelining
  stages by key width; past 256 key rows one stage, as two stages'
  prefetched ``[C, K]`` tiles overflowed shared memory at K = 512).
- ``delta_sweep_grads``: the same from the last chunk, for the states'
  and the pseudo-values' gradients.
- ``wy_grads``: two kernels over chunks. The first takes ``T`` (kept by the
  WY kernel's rerun in the backward pass) and gives ``dT``, ``dv`` and
  ``dA``, with ``A_k`` computed again after ``dA``; the second the keys'
  part (both sides of ``A_k``, and ``X``). One kernel with all of it
  spilled registers at 64-token chunks.

The outputs are ``gated_linear.gpu.outputs`` with ``v := U``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.gated_linear import chunk_math as cm
from pallas_kernels.gated_linear import gpu as gl

_F32 = jnp.float32
# Value columns per program of the delta sweeps (all key rows are held):
# 32 in bfloat16 up to 128 key rows, 16 past them and for float32 inputs
# (the widest that compile without a spill at 64-token chunks).
SWEEP_BLOCK_V = 32
NARROW_SWEEP_BLOCK_V = 16
# Key rows per block of the sweeps' state (their loops over key blocks).
SWEEP_BLOCK_K = 64
# Warps of the sweeps past 256 key rows (8 spilled on sm_80 at K = 512).
WIDE_SWEEP_WARPS = 4


def _exact(spec: cm.Spec) -> cm.Spec:
  """``spec`` with the inverse's matmuls: 3xTF32 (float32 accuracy) for
  float32 inputs, TF32 for bfloat16 ones."""
  return dataclasses.replace(spec,
                             mode="tf32" if spec.mode == "bf16" else "tf32x3")


def inverse(spec: cm.Spec, a, d: cm.Docs):
  """``(I + A)^{-1}`` of a strictly lower ``a [C, C]`` (float32, zero
  across documents), by the recursive block formula over the halving
  levels."""
  del d                                  # a is zero across documents
  c = spec.chunk
  exact = _exact(spec)
  def xor():                  # formed where used: fewer registers held
    return lax.bitwise_xor(cm.iota((c, c), 0), cm.iota((c, c), 1))

  t = (xor() == 0).astype(_F32)
  for s in reversed(cm.level_sizes(c)):                        # 1, 2, ..., C/2
    # Level s: s <= i ^ j < 2 s (with j < i: a is strictly lower).
    off = jnp.where(lax.shift_right_logical(xor(), s.bit_length() - 1) == 1,
                    a, 0.0)
    t = t - cm.dot(cm.dot(t, off, cm.NN, exact), t, cm.NN, exact)
  return t


def _x_block(r, beta, d: cm.Docs, cols):
  """``(X, read exp(P) k)`` of a key block, ``X = b read exp(P) k``."""
  p = gl.gate_at(r, (slice(None), cols))
  xk = r["k"][:, cols].astype(_F32) * cm.read_weights(p, d)
  return xk * beta[:, None], xk


def _key_scores(r, spec: cm.Spec, lay: gl.Layout, d: cm.Docs, below):
  """``A_k [C, C]``: the keys' scores with themselves, strictly lower
  (``below``)."""
  return jnp.where(below, gl.scores_of({**r, "q": r["k"]}, spec, lay, d),
                   0.0)


def _wy_kernel(r, *, spec: cm.Spec, lay: gl.Layout):
  """``W = T X`` and ``U' = T Y`` of a chunk, with the keys' scores with
  themselves ``A_k`` (strictly lower) and ``T = (I + diag(b) A_k)^{-1}``;
  ``T`` also goes out with ``keep`` (``wy``)."""
  c = spec.chunk
  d = gl.docs_at(r, spec, slice(None))
  beta = r["beta"][...]                                         # [C]
  below = cm.iota((c, c), 0) > cm.iota((c, c), 1)
  a_k = _key_scores(r, spec, lay, d, below)
  t_op = cm.operand(inverse(spec, a_k * beta[:, None], d), spec)
  width = lay.inner_k

  def w_part(j, carry):
    cols = gl.column_block(j, width)
    x, _ = _x_block(r, beta, d, cols)
    r["w"][:, cols] = cm.dot(t_op, cm.operand(x, spec), cm.NN,
                             spec).astype(r["w"].dtype)
    return carry

  gl.loop(lay.k_pad // width, w_part, 0)
  v_width = lay.inner_v

  def u_part(j, carry):
    cols = gl.column_block(j, v_width)
    y = r["v"][:, cols].astype(_F32) * beta[:, None]
    r["u"][:, cols] = cm.dot(t_op, cm.operand(y, spec), cm.NN,
                             spec).astype(r["u"].dtype)
    return carry

  gl.loop(lay.v_pad // v_width, u_part, 0)
  if "t" in r:                                # kept for the WY gradient
    r["t"][...] = t_op.astype(r["t"].dtype)


def beta_to_kernel(beta, lay: gl.Layout):
  """``[B, T, H]`` -> ``[B, T_pad, H]`` float32 (zero on padding: a padded
  token writes nothing)."""
  return gl.pad_to(beta, (lay.batch, lay.t_pad, lay.heads), _F32)


def _square_spec(lay: gl.Layout):
  """``[B, T_pad, H, C]``: a ``[C, C]`` matrix per chunk, its rows the
  chunk's tokens."""
  c = lay.chunk
  return pl.BlockSpec((None, c, None, c), lambda b, h, p: (b, p, h, 0))


def wy(arrays, spec: cm.Spec, lay: gl.Layout, *, keep: bool = False,
       interpret: bool):
  """``{"w": [B, T_pad, H, K_pad], "u": [B, T_pad, H, V_pad]}`` in the
  matmul dtype: ``W`` and ``U'`` of every chunk; with ``keep`` (for
  ``wy_grads``) also ``"t"`` (``T`` as a matmul operand, ``[B, T_pad, H,
  C]``)."""
  specs = gl.chunk_specs(lay, 1, lay.v_pad)
  inputs = gl.chunk_inputs(arrays, spec, specs, [("k", "k"), ("v", "v")])
  inputs["beta"] = (arrays["beta"], specs["gate_scalar"])
  b, h, t = lay.batch, lay.heads, lay.t_pad
  dtype = arrays["k"].dtype
  out = {"w": (jax.ShapeDtypeStruct((b, t, h, lay.k_pad), dtype), specs["k"]),
         "u": (jax.ShapeDtypeStruct((b, t, h, lay.v_pad), dtype), specs["v"])}
  if keep:
    square = (b, t, h, lay.chunk)
    out["t"] = (jax.ShapeDtypeStruct(square, dtype), _square_spec(lay))
  return gl.call(functools.partial(_wy_kernel, spec=spec, lay=lay),
                 (b, h, lay.chunks), inputs, out, lay, name="delta_rule_wy",
                 cost=_wy_cost(spec, lay, inputs, "wy"),
                 interpret=interpret)


def _wy_cost(spec: cm.Spec, lay: gl.Layout, inputs, kind: str):
  """The WY kernels' estimate, matmuls counted from their bodies per chunk
  (``kind``: ``"wy"``, ``"wy_grads"`` or ``"wy_key_grads"``): the keys'
  scores ``S`` (``2 C^2 K`` whatever the gate: with a per-channel decay,
  by row blocks, ``gated_linear.gpu._flops``; once in ``wy`` and
  ``wy_grads``, twice in ``wy_key_grads``: rows and columns), the
  inverse's two ``[C, C, C]`` products per halving level in ``wy`` and
  ``dA``'s two in ``wy_grads`` in the inverse's mode (``_exact``: 3xTF32
  runs three products, TF32 one), and ``T`` times the ``[C, K]`` and
  ``[C, V]`` right-hand sides (``wy``: ``W`` and ``U'``; ``wy_grads``:
  ``dT``'s key part, ``dY`` and ``dT``'s value part; ``wy_key_grads``:
  ``dX``)."""
  c, kk, vv = lay.chunk, lay.k_pad, lay.v_pad
  levels = c.bit_length() - 1
  passes = 3 if spec.mode == "tf32x3" else 1
  inverse_passes = 3 if _exact(spec).mode == "tf32x3" else 1
  scores = 2 * c * c * kk
  inverse_products = {"wy": 2 * levels, "wy_grads": 2,
                      "wy_key_grads": 0}[kind]
  sides = {"wy": kk + vv, "wy_grads": kk + 2 * vv, "wy_key_grads": kk}[kind]
  flops = ((scores * {"wy": 1, "wy_grads": 1, "wy_key_grads": 2}[kind]
            + 2 * c * c * sides) * passes
           + inverse_products * 2 * c ** 3 * inverse_passes)
  b, h = lay.batch, lay.heads
  return gl.compiler.cost(
      flops=flops * lay.chunks * b * h,
      transcendentals=b * h * lay.t_pad * (kk if spec.gate == "channel"
                                           else c),
      arrays=[x for x, _ in inputs.values()])


def _sweep_spec(spec: cm.Spec) -> cm.Spec:
  """The sweeps' matmuls: bfloat16 operands, or IEEE float32 for float32
  inputs (3xTF32's split operands of the ``[K, BV]`` state spilled)."""
  return spec if spec.mode == "bf16" else dataclasses.replace(spec,
                                                              mode="f32")


def _key_blocks(k_pad: int):
  """The sweeps' key blocks: ``[(start, width)]``, ``SWEEP_BLOCK_K`` rows
  each (all of them below that)."""
  width = min(SWEEP_BLOCK_K, k_pad)
  return [(b * width, width) for b in range(k_pad // width)]


def _carry_decay(r, spec: cm.Spec, n, d: cm.Docs, cols):
  """``carry exp(P_L)`` of chunk ``n`` at the key columns ``cols``: ``[]``
  or ``[BK, 1]``, from the gates' last row only."""
  c = spec.chunk
  last = pl.ds(n * c + c - 1, 1)
  decay = cm.carry_decay(gl.gate_at(r, (last, cols)), d)
  return decay[:, None] if decay.ndim else decay


def _sweep_blocks(r, blocks, shape, n_chunks: int, body):
  """Runs ``body`` over the chunks on the state held as key blocks: from
  ``state_in`` (or zeros), the last into ``state_out`` where asked."""
  s = tuple(r["state_in"][pl.ds(start, width), :] if "state_in" in r
            else jnp.zeros((width, shape[1]), _F32)
            for start, width in blocks)
  s = lax.fori_loop(0, n_chunks, body, s)
  if "state_out" in r:
    for (start, width), s_b in zip(blocks, s):
      r["state_out"][pl.ds(start, width), :] = s_b


def _delta_sweep_kernel(r, *, spec: cm.Spec, n_chunks: int, shape):
  spec = _sweep_spec(spec)
  c = spec.chunk
  blocks = _key_blocks(shape[0])

  def body(n, s):
    rows = pl.ds(pl.multiple_of(n * c, c), c)
    d = gl.docs_at(r, spec, rows)
    u = r["u_prime"][rows, :].astype(_F32)
    for (start, width), s_b in zip(blocks, s):
      cols = pl.ds(start, width)
      r["states"][n, cols, :] = s_b.astype(r["states"].dtype)
      u = u - cm.dot(r["w"][rows, cols], cm.operand(s_b, spec), cm.NN,
                     spec)                                      # [C, BV]
    r["u"][rows, :] = u.astype(r["u"].dtype)
    u_op = cm.operand(u, spec)
    out = []
    for (start, width), s_b in zip(blocks, s):
      cols = pl.ds(start, width)
      out.append(s_b * _carry_decay(r, spec, n, d, cols)
                 + cm.dot(r["kw"][rows, cols], u_op, cm.TN, spec))
    return tuple(out)

  _sweep_blocks(r, blocks, shape, n_chunks, body)


def _sweep_operands_kernel(r, *, spec: cm.Spec, lay: gl.Layout):
  """``kw = write exp(P_L - P) k`` and ``qr = scale read exp(P) q`` of one
  chunk, as the sweeps' matmul operands."""
  op_spec = _sweep_spec(spec)
  d = gl.docs_at(r, spec, slice(None))
  width = min(SWEEP_BLOCK_K, lay.k_pad)

  def part(j, carry):
    cols = gl.column_block(j, width)
    p = gl.gate_at(r, (slice(None), cols))
    kw = r["k"][:, cols].astype(_F32) * cm.write_weights(p, d)
    r["kw"][:, cols] = cm.operand(kw, op_spec)
    if "q" in r:
      qr = (r["q"][:, cols].astype(_F32)
            * (cm.read_weights(p, d) * spec.scale))
      r["qr"][:, cols] = cm.operand(qr, op_spec)
    return carry

  gl.loop(lay.k_pad // width, part, 0)


def sweep_operands(arrays, spec: cm.Spec, lay: gl.Layout, *, reads: bool,
                   interpret: bool):
  """``{"kw"}`` (and ``"qr"`` with ``reads``), ``[B, T_pad, H, K_pad]`` in
  the sweeps' operand dtype: the keys as the state's writes and the
  queries as its reads, every decay and document mask applied (the
  sweeps then hold no ``[C, K]`` float32 tile of gates)."""
  specs = gl.chunk_specs(lay, 1, lay.v_pad)
  names = [("k", "k")] + ([("q", "k")] if reads else [])
  inputs = gl.chunk_inputs(arrays, spec, specs, names)
  b, h, t = lay.batch, lay.heads, lay.t_pad
  shape = jax.ShapeDtypeStruct((b, t, h, lay.k_pad), arrays["k"].dtype)
  out = {"kw": (shape, specs["k"])}
  if reads:
    out["qr"] = (shape, specs["k"])
  exps = 0 if spec.gate == "none" else (
      lay.k_pad if spec.gate == "channel" else 1) * len(out)
  cost = gl.compiler.cost(flops=0, transcendentals=b * h * t * exps,
                          arrays=[x for x, _ in inputs.values()])
  return gl.call(functools.partial(_sweep_operands_kernel, spec=spec,
                                   lay=lay),
                 (b, h, lay.chunks), inputs, out, lay,
                 name="delta_rule_sweep_operands", cost=cost,
                 interpret=interpret)


def sweep_layout(lay: gl.Layout, spec: cm.Spec) -> gl.Layout:
  """The delta sweeps' tiles and settings: all key rows (in blocks of
  ``SWEEP_BLOCK_K``), ``SWEEP_BLOCK_V`` value columns up to 128 key rows
  in bfloat16, ``NARROW_SWEEP_BLOCK_V`` past them and in float32; two
  pipelining stages up to 256 key rows, one stage and
  ``WIDE_SWEEP_WARPS`` past them."""
  narrow = spec.mode != "bf16" or lay.k_pad > 128
  wide = lay.k_pad > 256
  width = NARROW_SWEEP_BLOCK_V if narrow else SWEEP_BLOCK_V
  return dataclasses.replace(
      lay, sweep_k=lay.k_pad, sweep_v=min(width, lay.v_pad),
      num_stages=1 if wide else 2,
      num_warps=WIDE_SWEEP_WARPS if wide else lay.num_warps)


def delta_sweep(arrays, w, u_prime, kw, spec: cm.Spec, lay: gl.Layout, *,
                state_in=None, state_out: bool, states_dtype,
                interpret: bool):
  """``{"states": h [B, H, N, K, V], "u": U [B, T_pad, H, V_pad]}`` and the
  final state (``state_out``); ``kw``: ``sweep_operands``'."""
  lay = sweep_layout(lay, spec)
  b, h = lay.batch, lay.heads
  return gl.sweep_call(
      functools.partial(_delta_sweep_kernel, spec=spec), arrays, spec, lay,
      {"kw": (kw, "k"), "w": (w, "k"), "u_prime": (u_prime, "v")},
      state_in=state_in, state_out=state_out, states_dtype=states_dtype,
      extra_outputs={"u": (jax.ShapeDtypeStruct(
          (b, lay.t_pad, h, lay.v_pad), w.dtype), "v")},
      name="delta_rule_sweep",
      cost=2 * 2 * lay.t_pad * lay.k_pad * lay.v_pad * b * h,
      interpret=interpret)


def _delta_sweep_grad_kernel(r, *, spec: cm.Spec, n_chunks: int, shape):
  spec = _sweep_spec(spec)
  c = spec.chunk
  blocks = _key_blocks(shape[0])

  def body(i, ds):
    n = n_chunks - 1 - i
    rows = pl.ds(pl.multiple_of(n * c, c), c)
    d = gl.docs_at(r, spec, rows)
    du = r["du_intra"][rows, :]
    for (start, width), ds_b in zip(blocks, ds):
      cols = pl.ds(start, width)
      r["states"][n, cols, :] = ds_b.astype(r["states"].dtype)
      du = du + cm.dot(r["kw"][rows, cols], cm.operand(ds_b, spec), cm.NN,
                       spec)
    r["du"][rows, :] = du                                       # [C, BV]
    du_op = cm.operand(du, spec)
    out = []
    for (start, width), ds_b in zip(blocks, ds):
      cols = pl.ds(start, width)
      out.append(ds_b * _carry_decay(r, spec, n, d, cols)
                 + cm.dot(r["qr"][rows, cols], r["do"][rows, :], cm.TN, spec)
                 - cm.dot(r["w"][rows, cols], du_op, cm.TN, spec))
    return tuple(out)

  _sweep_blocks(r, blocks, shape, n_chunks, body)


def delta_sweep_grads(arrays, w, du_intra, kw, qr, spec: cm.Spec,
                      lay: gl.Layout, *, state_in=None, state_out: bool,
                      states_dtype, interpret: bool):
  """The reverse sweep: ``{"states": dh [B, H, N, K, V]`` (the gradient of
  the state leaving each chunk), ``"du"`` (the pseudo-values' whole
  gradient, ``du_intra + (write k) dh``, float32)}`` and the initial
  state's gradient (``state_out``); ``state_in``: the final state's
  gradient; ``kw``, ``qr``: ``sweep_operands``'.

      dh_n = carry exp(P_L) dh_{n+1} + scale (read exp(P) q)^T do - W^T dU
  """
  lay = sweep_layout(lay, spec)
  b, h = lay.batch, lay.heads
  return gl.sweep_call(
      functools.partial(_delta_sweep_grad_kernel, spec=spec), arrays, spec,
      lay, {"qr": (qr, "k"), "kw": (kw, "k"), "w": (w, "k"),
            "do": (arrays["do"], "v"), "du_intra": (du_intra, "v")},
      state_in=state_in, state_out=state_out, states_dtype=states_dtype,
      extra_outputs={"du": (jax.ShapeDtypeStruct(
          (b, lay.t_pad, h, lay.v_pad), _F32), "v")},
      name="delta_rule_sweep_grads",
      cost=3 * 2 * lay.t_pad * lay.k_pad * lay.v_pad * b * h,
      interpret=interpret)


def _wy_grad_kernel(r, *, spec: cm.Spec, lay: gl.Layout):
  """What ``W`` and ``U'`` send back through ``T = (I + A)^{-1}``, up to
  ``dA``:

      dX = T^T dW,  dY = T^T dU,  dT = dW X^T + dU Y^T,
      dA = -T^T dT T^T (on the strictly lower pairs),

  with ``X = b read exp(P) k``, ``Y = b v`` and ``A = diag(b) A_k``,
  ``A_k[i, j] = k_i . (exp(P_i - P_j) k_j)``; ``T`` as the WY kernel
  kept it (``wy(keep=True)``), ``A_k`` computed again after ``dA``.
  Writes ``dv = b dY``, ``dA_k = diag(b) dA`` (float32), ``beta``'s
  terms from ``Y`` and ``A`` and, with a scalar decay, the pairs' part of
  the log-decays' terms; ``_wy_key_grad_kernel`` does the keys' part.
  """
  every = slice(None)
  c = spec.chunk
  d = gl.docs_at(r, spec, every)
  beta = r["beta"][...]
  below = cm.iota((c, c), 0) > cm.iota((c, c), 1)
  t_op = r["t"][...]
  width, v_width = lay.inner_k, lay.inner_v

  def dt_keys(j, acc):
    cols = gl.column_block(j, width)
    x, _ = _x_block(r, beta, d, cols)
    return acc + cm.dot(cm.operand(r["dw"][:, cols], spec),
                        cm.operand(x, spec), cm.NT, spec)

  def dt_values(j, acc):
    cols = gl.column_block(j, v_width)
    y = r["v"][:, cols].astype(_F32) * beta[:, None]
    du = r["du"][:, cols]
    # dv = b T^T dU, and beta's part sum_v v dY.
    dy = cm.dot(t_op, cm.operand(du, spec), cm.TN, spec)        # [C, BV]
    r["dv"][:, cols] = (dy * beta[:, None]).astype(r["dv"].dtype)
    dt, dbeta = acc
    dt = dt + cm.dot(cm.operand(du, spec), cm.operand(y, spec), cm.NT, spec)
    return dt, dbeta + jnp.sum(dy * r["v"][:, cols].astype(_F32), axis=1)

  zeros = jnp.zeros((c, c), _F32)
  dt = gl.loop(lay.k_pad // width, dt_keys, zeros)
  dt, dbeta = gl.loop(lay.v_pad // v_width, dt_values,
                      (dt, jnp.zeros((c,), _F32)))
  # In the inputs' matmul mode: for bfloat16 inputs dA is a bfloat16
  # operand of the keys' products.
  da = -cm.dot(cm.dot(t_op, dt, cm.TN, spec), t_op, cm.NT, spec)  # [C, C]
  da = jnp.where(below & d.pair, da, 0.0)
  # A_k again (the WY kernel's scores): kept, it spilled that kernel's
  # registers on sm_80.
  a_k = _key_scores(r, spec, lay, d, below)
  r["dbeta"][...] = dbeta + jnp.sum(da * a_k, axis=1)
  da_k = da * beta[:, None]                                     # dL/dA_k
  r["da"][...] = da_k
  if spec.gate == "scalar":
    terms = da_k * a_k                                          # j < i only
    r["gate_rows"][...] = jnp.sum(terms, axis=1) - jnp.sum(terms, axis=0)


def _wy_key_grad_kernel(r, *, spec: cm.Spec, lay: gl.Layout):
  """The keys' part of the WY gradient, from ``T`` and ``dA_k``
  (``_wy_grad_kernel``), by key blocks: ``dk`` from both sides of ``A_k``
  (the gradient ``gated_linear``'s ``dq``/``dk`` takes for scores, with
  the keys on both sides) and from ``X`` (``dX = T^T dW``), ``beta``'s
  terms from ``X`` and the log-decays' rows (``exp(P_i)`` in ``X``, and
  with a decay per key channel the pairs of ``A_k``: rows less
  columns)."""
  every = slice(None)
  c = spec.chunk
  d = gl.docs_at(r, spec, every)
  beta = r["beta"][...]
  da_k = r["da"][...]
  t_op = r["t"][...]
  keys = {**r, "q": r["k"]}
  width = lay.inner_k
  if spec.gate != "channel":
    weights = cm.pair_weights(gl.gate_at(r, every), d)
    da_op = cm.operand(da_k * weights, spec)
  else:
    pair_grads = gl.ChannelPairGrads(da_k, spec)

  def key_block(j, totals):
    cols = gl.column_block(j, width)
    k = r["k"][:, cols]
    kf = k.astype(_F32)
    p = gl.gate_at(r, (every, cols))
    if spec.gate == "channel":
      rows_k, cols_k = pair_grads(keys, cols)
    else:
      rows_k = cm.dot(da_op, k, cm.NN, spec)
      cols_k = cm.dot(da_op, k, cm.TN, spec)
    x, xk = _x_block(r, beta, d, cols)
    dx = cm.dot(t_op, cm.operand(r["dw"][:, cols], spec), cm.TN, spec)
    r["dk"][:, cols] = rows_k + cols_k + dx * beta[:, None] * (
        cm.read_weights(p, d))
    dbeta_part = jnp.sum(dx * xk, axis=1)
    rows = x * dx
    if spec.gate == "channel":
      r["gate_rows"][:, cols] = rows + kf * rows_k - kf * cols_k
      return totals[0] + dbeta_part, totals[1]
    return totals[0] + dbeta_part, totals[1] + jnp.sum(rows, axis=1)

  vector = jnp.zeros((c,), _F32)
  dbeta_x, x_rows = gl.loop(lay.k_pad // width, key_block, (vector, vector))
  r["dbeta"][...] = dbeta_x
  if spec.gate == "scalar":
    r["gate_rows"][...] = x_rows


def wy_grads(arrays, kept, dw, du, spec: cm.Spec, lay: gl.Layout, *,
             interpret: bool):
  """``{"dk", "dv", "dbeta"}`` and, with a decay, ``"gate_rows"`` (all
  float32): what ``W`` and ``U'`` send back (``dw``, ``du``: their
  gradients, ``[B, T_pad, H, K_pad]`` and ``[B, T_pad, H, V_pad]``;
  ``kept``: ``wy(keep=True)``'s ``"t"``). Two kernels over
  chunks: ``dA`` (with ``dv``), then the keys' part; ``beta``'s terms and
  a scalar decay's rows are the sums of both."""
  specs = gl.chunk_specs(lay, 1, lay.v_pad)
  b, h, t, c = lay.batch, lay.heads, lay.t_pad, lay.chunk
  square = _square_spec(lay)
  scalar = jax.ShapeDtypeStruct((b, t, h), _F32)
  gate_shape = (b, t, h) if spec.gate == "scalar" else (b, t, h, lay.k_pad)
  inputs = gl.chunk_inputs(arrays, spec, specs, [("k", "k"), ("v", "v")])
  inputs["beta"] = (arrays["beta"], specs["gate_scalar"])
  inputs["dw"] = (dw, specs["k"])
  inputs["du"] = (du, specs["v"])
  inputs["t"] = (kept["t"], square)
  out = {"dv": (jax.ShapeDtypeStruct((b, t, h, lay.v_pad), _F32), specs["v"]),
         "da": (jax.ShapeDtypeStruct((b, t, h, c), _F32), square),
         "dbeta": (scalar, specs["gate_scalar"])}
  if spec.gate == "scalar":
    out["gate_rows"] = (scalar, specs["gate_scalar"])
  first = gl.call(functools.partial(_wy_grad_kernel, spec=spec, lay=lay),
                  (b, h, lay.chunks), inputs, out, lay,
                  name="delta_rule_wy_grads",
                  cost=_wy_cost(spec, lay, inputs, "wy_grads"),
                  interpret=interpret)
  inputs = gl.chunk_inputs(arrays, spec, specs, [("k", "k")])
  inputs["beta"] = (arrays["beta"], specs["gate_scalar"])
  inputs["dw"] = (dw, specs["k"])
  inputs["t"] = (kept["t"], square)
  inputs["da"] = (first["da"], square)
  out = {"dk": (jax.ShapeDtypeStruct((b, t, h, lay.k_pad), _F32), specs["k"]),
         "dbeta": (scalar, specs["gate_scalar"])}
  if spec.gate != "none":
    out["gate_rows"] = (jax.ShapeDtypeStruct(gate_shape, _F32),
                        specs["gate_" + spec.gate])
  second = gl.call(functools.partial(_wy_key_grad_kernel, spec=spec, lay=lay),
                   (b, h, lay.chunks), inputs, out, lay,
                   name="delta_rule_wy_key_grads",
                   cost=_wy_cost(spec, lay, inputs, "wy_key_grads"),
                   interpret=interpret)
  result = {"dk": second["dk"], "dv": first["dv"],
            "dbeta": first["dbeta"] + second["dbeta"]}
  if spec.gate == "scalar":
    result["gate_rows"] = second["gate_rows"] + first["gate_rows"]
  elif spec.gate == "channel":
    result["gate_rows"] = second["gate_rows"]
  return result
