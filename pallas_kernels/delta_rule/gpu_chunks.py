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
- ``delta_sweep`` (grid ``(B, H, V / BV)``): the sequential pass. A program
  owns the float32 state's value columns ``[K, BV]`` (all key rows: ``W
  h`` sums over them) and per chunk writes ``h_n``, then ``U = U' - W h_n``
  and the state update.

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
# 32, or 16 for float32 inputs (3xTF32 splits the state's operand) and for
# more than 256 key rows (the widest that compile without a spill).
SWEEP_BLOCK_V = 32
NARROW_SWEEP_BLOCK_V = 16


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
  xor = lax.bitwise_xor(cm.iota((c, c), 0), cm.iota((c, c), 1))
  t = (xor == 0).astype(_F32)
  for s in reversed(cm.level_sizes(c)):                        # 1, 2, ..., C/2
    # Level s: s <= i ^ j < 2 s (with j < i: a is strictly lower).
    off = jnp.where(lax.shift_right_logical(xor, s.bit_length() - 1) == 1,
                    a, 0.0)
    t = t - cm.dot(cm.dot(t, off, cm.NN, exact), t, cm.NN, exact)
  return t


class _Chunk:
  """A chunk's WY setting, shared by the WY kernel and its gradient: the
  documents, ``b``, the keys' scores with themselves ``A_k`` (strictly
  lower) and ``T = (I + diag(b) A_k)^{-1}``."""

  def __init__(self, r, spec: cm.Spec, lay: gl.Layout):
    c = spec.chunk
    self.d = gl.docs_at(r, spec, slice(None))
    self.beta = r["beta"][...]                                  # [C]
    self.below = cm.iota((c, c), 0) > cm.iota((c, c), 1)
    keys = {**r, "q": r["k"]}
    self.a_k = jnp.where(self.below, gl.scores_of(keys, spec, lay, self.d),
                         0.0)                                   # [C, C]
    self.t = inverse(spec, self.a_k * self.beta[:, None], self.d)
    self._r = r

  def x_block(self, cols):
    """``(X, read exp(P) k)`` of a key block, ``X = b read exp(P) k``."""
    p = gl.gate_at(self._r, (slice(None), cols))
    xk = self._r["k"][:, cols].astype(_F32) * cm.read_weights(p, self.d)
    return xk * self.beta[:, None], xk


def _wy_kernel(r, *, spec: cm.Spec, lay: gl.Layout):
  chunk = _Chunk(r, spec, lay)
  beta = chunk.beta
  t_op = cm.operand(chunk.t, spec)
  width = lay.inner_k

  def w_part(j, carry):
    cols = gl.column_block(j, width)
    x, _ = chunk.x_block(cols)
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


def beta_to_kernel(beta, lay: gl.Layout):
  """``[B, T, H]`` -> ``[B, T_pad, H]`` float32 (zero on padding: a padded
  token writes nothing)."""
  return gl.pad_to(beta, (lay.batch, lay.t_pad, lay.heads), _F32)


def wy(arrays, spec: cm.Spec, lay: gl.Layout, *, interpret: bool):
  """``{"w": [B, T_pad, H, K_pad], "u": [B, T_pad, H, V_pad]}`` in the
  matmul dtype: ``W`` and ``U'`` of every chunk."""
  specs = gl.chunk_specs(lay, 1, lay.v_pad)
  inputs = gl.chunk_inputs(arrays, spec, specs, [("k", "k"), ("v", "v")])
  inputs["beta"] = (arrays["beta"], specs["gate_scalar"])
  b, h, t = lay.batch, lay.heads, lay.t_pad
  dtype = arrays["k"].dtype
  out = {"w": (jax.ShapeDtypeStruct((b, t, h, lay.k_pad), dtype), specs["k"]),
         "u": (jax.ShapeDtypeStruct((b, t, h, lay.v_pad), dtype), specs["v"])}
  return gl.call(functools.partial(_wy_kernel, spec=spec, lay=lay),
                 (b, h, lay.chunks), inputs, out, lay, name="delta_rule_wy",
                 cost=_wy_cost(spec, lay, inputs, backward=False),
                 interpret=interpret)


def _wy_cost(spec: cm.Spec, lay: gl.Layout, inputs, *, backward: bool):
  """The WY kernels' estimate, matmuls counted from their bodies per chunk:
  the keys' scores ``S`` (``2 C^2 K`` whatever the gate: with a
  per-channel decay, by row blocks, ``gated_linear.gpu._flops``; three
  times backward: scores, rows, columns), the inverse's two ``[C, C, C]``
  products per halving level (and two more for ``dA``) in the inverse's
  mode (``_exact``: 3xTF32 runs three products, TF32 one), and ``T``
  times the ``[C, K + V]`` right-hand sides (four such products
  backward)."""
  c, kk, vv = lay.chunk, lay.k_pad, lay.v_pad
  levels = c.bit_length() - 1
  passes = 3 if spec.mode == "tf32x3" else 1
  inverse_passes = 3 if _exact(spec).mode == "tf32x3" else 1
  scores = 2 * c * c * kk
  inverse_products = 2 * (levels + (1 if backward else 0))
  flops = ((scores * (3 if backward else 1)
            + 2 * c * c * (kk + vv) * (2 if backward else 1)) * passes
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


def _delta_sweep_kernel(r, *, spec: cm.Spec, n_chunks: int, shape):
  spec = _sweep_spec(spec)
  c = spec.chunk

  def body(n, s):
    r["states"][n] = s.astype(r["states"].dtype)
    rows = pl.ds(pl.multiple_of(n * c, c), c)
    p, d = gl.gate_at(r, rows), gl.docs_at(r, spec, rows)
    u = r["u_prime"][rows, :].astype(_F32) - cm.dot(
        r["w"][rows, :], cm.operand(s, spec), cm.NN, spec)      # [C, BV]
    r["u"][rows, :] = u.astype(r["u"].dtype)
    kw = r["k"][rows, :].astype(_F32) * cm.write_weights(p, d)
    decay = cm.carry_decay(p, d)                          # [] or [K]
    if decay.ndim:
      decay = decay[:, None]
    return s * decay + cm.dot(cm.operand(kw, spec), cm.operand(u, spec),
                              cm.TN, spec)

  s = r["state_in"][...] if "state_in" in r else jnp.zeros(shape, _F32)
  s = lax.fori_loop(0, n_chunks, body, s)
  if "state_out" in r:
    r["state_out"][...] = s


def sweep_layout(lay: gl.Layout, spec: cm.Spec) -> gl.Layout:
  """The delta sweeps' tiles: all key rows, ``SWEEP_BLOCK_V`` value
  columns (``NARROW_SWEEP_BLOCK_V`` in float32 or past 256 key rows)."""
  narrow = spec.mode != "bf16" or lay.k_pad > 256
  width = NARROW_SWEEP_BLOCK_V if narrow else SWEEP_BLOCK_V
  return dataclasses.replace(lay, sweep_k=lay.k_pad,
                             sweep_v=min(width, lay.v_pad))


def delta_sweep(arrays, w, u_prime, spec: cm.Spec, lay: gl.Layout, *,
                state_in=None, state_out: bool, states_dtype,
                interpret: bool):
  """``{"states": h [B, H, N, K, V], "u": U [B, T_pad, H, V_pad]}`` and the
  final state (``state_out``)."""
  lay = sweep_layout(lay, spec)
  b, h = lay.batch, lay.heads
  return gl.sweep_call(
      functools.partial(_delta_sweep_kernel, spec=spec), arrays, spec, lay,
      {"k": (arrays["k"], "k"), "w": (w, "k"), "u_prime": (u_prime, "v")},
      state_in=state_in, state_out=state_out, states_dtype=states_dtype,
      extra_outputs={"u": (jax.ShapeDtypeStruct(
          (b, lay.t_pad, h, lay.v_pad), w.dtype), "v")},
      name="delta_rule_sweep",
      cost=2 * 2 * lay.t_pad * lay.k_pad * lay.v_pad * b * h,
      interpret=interpret)


def _delta_sweep_grad_kernel(r, *, spec: cm.Spec, n_chunks: int, shape):
  spec = _sweep_spec(spec)
  c = spec.chunk

  def body(i, ds):
    n = n_chunks - 1 - i
    r["states"][n] = ds.astype(r["states"].dtype)
    rows = pl.ds(pl.multiple_of(n * c, c), c)
    p, d = gl.gate_at(r, rows), gl.docs_at(r, spec, rows)
    kw = r["k"][rows, :].astype(_F32) * cm.write_weights(p, d)
    du = r["du_intra"][rows, :] + cm.dot(cm.operand(kw, spec),
                                         cm.operand(ds, spec), cm.NN, spec)
    r["du"][rows, :] = du                                       # [C, BV]
    qr = (r["q"][rows, :].astype(_F32)
          * (cm.read_weights(p, d) * spec.scale))
    decay = cm.carry_decay(p, d)                          # [] or [K]
    if decay.ndim:
      decay = decay[:, None]
    return (ds * decay
            + cm.dot(cm.operand(qr, spec), r["do"][rows, :], cm.TN, spec)
            - cm.dot(r["w"][rows, :], cm.operand(du, spec), cm.TN, spec))

  ds = r["state_in"][...] if "state_in" in r else jnp.zeros(shape, _F32)
  ds = lax.fori_loop(0, n_chunks, body, ds)
  if "state_out" in r:
    r["state_out"][...] = ds


def delta_sweep_grads(arrays, w, du_intra, spec: cm.Spec, lay: gl.Layout, *,
                      state_in=None, state_out: bool, states_dtype,
                      interpret: bool):
  """The reverse sweep: ``{"states": dh [B, H, N, K, V]`` (the gradient of
  the state leaving each chunk), ``"du"`` (the pseudo-values' whole
  gradient, ``du_intra + (write k) dh``, float32)}`` and the initial
  state's gradient (``state_out``); ``state_in``: the final state's
  gradient.

      dh_n = carry exp(P_L) dh_{n+1} + scale (read exp(P) q)^T do - W^T dU
  """
  lay = sweep_layout(lay, spec)
  b, h = lay.batch, lay.heads
  return gl.sweep_call(
      functools.partial(_delta_sweep_grad_kernel, spec=spec), arrays, spec,
      lay, {"q": (arrays["q"], "k"), "k": (arrays["k"], "k"), "w": (w, "k"),
            "do": (arrays["do"], "v"), "du_intra": (du_intra, "v")},
      state_in=state_in, state_out=state_out, states_dtype=states_dtype,
      extra_outputs={"du": (jax.ShapeDtypeStruct(
          (b, lay.t_pad, h, lay.v_pad), _F32), "v")},
      name="delta_rule_sweep_grads",
      cost=3 * 2 * lay.t_pad * lay.k_pad * lay.v_pad * b * h,
      interpret=interpret)


def _wy_grad_kernel(r, *, spec: cm.Spec, lay: gl.Layout):
  """The gradients that ``W`` and ``U'`` send to ``k``, ``v``, ``beta`` and
  the log-decays, through ``T = (I + A)^{-1}``:

      dX = T^T dW,  dY = T^T dU,  dT = dW X^T + dU Y^T,
      dA = -T^T dT T^T (on the strictly lower pairs),

  with ``X = b read exp(P) k``, ``Y = b v``, ``A = diag(b) A_k`` and
  ``A_k[i, j] = k_i . (exp(P_i - P_j) k_j)``: the scores of keys with
  themselves, whose gradient is the one ``gated_linear``'s ``dq``/``dk``
  takes for scores, with the keys on both sides.
  """
  every = slice(None)
  c = spec.chunk
  chunk = _Chunk(r, spec, lay)
  d, beta, below, a_k, t = chunk.d, chunk.beta, chunk.below, chunk.a_k, chunk.t
  keys = {**r, "q": r["k"]}
  t_op = cm.operand(t, spec)
  width, v_width = lay.inner_k, lay.inner_v
  x_block = chunk.x_block

  def dt_keys(j, acc):
    cols = gl.column_block(j, width)
    x, _ = x_block(cols)
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
  # operand of the keys' products below.
  da = -cm.dot(cm.dot(t, dt, cm.TN, spec), t, cm.NT, spec)     # [C, C]
  da = jnp.where(below & d.pair, da, 0.0)
  dbeta = dbeta + jnp.sum(da * a_k, axis=1)
  da_k = da * beta[:, None]                                     # dL/dA_k
  if spec.gate != "channel":
    weights = cm.pair_weights(gl.gate_at(r, every), d)
    da_op = cm.operand(da_k * weights, spec)
    if spec.gate == "scalar":
      terms = da_k * a_k                                        # j < i only
      pair_terms = jnp.sum(terms, axis=1) - jnp.sum(terms, axis=0)
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
    x, xk = x_block(cols)
    dx = cm.dot(t_op, cm.operand(r["dw"][:, cols], spec), cm.TN, spec)
    r["dk"][:, cols] = rows_k + cols_k + dx * beta[:, None] * (
        cm.read_weights(p, d))
    dbeta_part = jnp.sum(dx * xk, axis=1)
    # The log-decays' rows: exp(P_i) in X, and the pairs of A_k (rows less
    # columns).
    rows = x * dx
    if spec.gate == "channel":
      r["gate_rows"][:, cols] = rows + kf * rows_k - kf * cols_k
      return totals[0] + dbeta_part, totals[1]
    return totals[0] + dbeta_part, totals[1] + jnp.sum(rows, axis=1)

  vector = jnp.zeros((c,), _F32)
  dbeta_x, x_rows = gl.loop(lay.k_pad // width, key_block, (vector, vector))
  r["dbeta"][...] = dbeta + dbeta_x
  if spec.gate == "scalar":
    r["gate_rows"][...] = x_rows + pair_terms


def wy_grads(arrays, dw, du, spec: cm.Spec, lay: gl.Layout, *,
             interpret: bool):
  """``{"dk", "dv", "dbeta"}`` and, with a decay, ``"gate_rows"`` (all
  float32): what ``W`` and ``U'`` send back (``dw``, ``du``: their
  gradients, ``[B, T_pad, H, K_pad]`` and ``[B, T_pad, H, V_pad]``)."""
  specs = gl.chunk_specs(lay, 1, lay.v_pad)
  inputs = gl.chunk_inputs(arrays, spec, specs, [("k", "k"), ("v", "v")])
  inputs["beta"] = (arrays["beta"], specs["gate_scalar"])
  inputs["dw"] = (dw, specs["k"])
  inputs["du"] = (du, specs["v"])
  b, h, t = lay.batch, lay.heads, lay.t_pad
  out = {"dk": (jax.ShapeDtypeStruct((b, t, h, lay.k_pad), _F32), specs["k"]),
         "dv": (jax.ShapeDtypeStruct((b, t, h, lay.v_pad), _F32), specs["v"]),
         "dbeta": (jax.ShapeDtypeStruct((b, t, h), _F32),
                   specs["gate_scalar"])}
  if spec.gate != "none":
    shape = (b, t, h) if spec.gate == "scalar" else (b, t, h, lay.k_pad)
    out["gate_rows"] = (jax.ShapeDtypeStruct(shape, _F32),
                        specs["gate_" + spec.gate])
  return gl.call(functools.partial(_wy_grad_kernel, spec=spec, lay=lay),
                 (b, h, lay.chunks), inputs, out, lay,
                 name="delta_rule_wy_grads",
                 cost=_wy_cost(spec, lay, inputs, backward=True),
                 interpret=interpret)
