"""Chunk-parallel Mosaic (TPU) kernels of the delta rule.

    S_t = (I - b_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T,
    o_t = S_t^T (scale q_t)

The split of ``gpu_chunks.py`` (flash-linear-attention's
``chunk_gated_delta_rule``) on the Mosaic bodies and the ``[B, H, T, F]``
layout of ``gated_linear/tpu_chunks.py``. In a chunk, with ``P`` the
gates' prefix sums from its start, the WY form gives the pseudo-values
``U = U' - W h_n`` of the state ``h_n`` entering the chunk,

    A[i, j] = b_i k_i . (exp(P_i - P_j) k_j)      (j < i, one document)
    T = (I + A)^{-1},  W = T (b read exp(P) k),  U' = T (b v),

and the chunk is then gated linear attention on the values ``U``. Kernels:

- ``delta_rule_tpu_wy``, grid ``(B, H, N)``, all parallel: ``A`` (the
  keys' scores with themselves, ``[C, C]``; by row blocks for a decay per
  key channel), ``T``, then ``W`` and ``U'`` per block of key or value
  columns.
- ``delta_rule_tpu_sweep``, grid ``(B, H, V / BV, N)``, the chunk axis
  sequential: a program owns the float32 state's value rows ``[BV, K]``
  (all key columns: ``W h`` sums over them) and per chunk writes ``h_n``,
  then ``U = U' - W h_n`` and the state update, key block by key block.
- The outputs: ``gated_linear_tpu_outputs`` with ``v := U``.
- Backward (only the inputs are kept): ``wy`` and the sweep again; the
  part of ``U``'s gradient from its own chunk, ``scale A_qk^T do``
  (``gated_linear_tpu_dv``); ``delta_rule_tpu_sweep_grads``, the sweep
  walked from the last chunk for ``dU`` and the gradient of the state
  leaving each chunk, ``dh_n = carry exp(P_L) dh_{n+1} + scale (read
  exp(P) q)^T do - W^T dU``; ``gated_linear_tpu_grads`` on ``U`` for
  ``dq``, ``dk``, ``dW = -dU h^T`` and the log-decays' terms; and
  ``delta_rule_tpu_wy_grads`` for what ``W`` and ``U'`` send back to
  ``k``, ``v``, ``b`` and the log-decays through ``T``.

The inverse (``_inverse``): forward substitution by row blocks of
``INVERSE_BLOCK`` tokens, ``T_i = (I + A_ii)^{-1} (E_i - A_i T)``, with
``A_i`` the block's ``[16, C]`` rows (the rows of ``T`` at and after the
block are still zero in the scratch, so the product sums over the rows
before it only), ``E_i`` the identity's rows and the diagonal block's
inverse by the doubling formula ``T_2s = T_s - T_s A_s T_s`` on ``[16,
16]`` values. Its products split float32 operands into bfloat16 parts
(``common/dots.split_dot``): for bfloat16 inputs ``A`` rounded to
bfloat16 (one part) and ``T`` in two, ``T`` then rounded to a bfloat16
operand of ``W`` and ``U'``; for float32 inputs three parts each (float32
accuracy). The MXU's own multi-pass float32 mode kept its parts in vector
registers and spilled. The backward pass needs no second inverse: ``dX =
T^T dW``, ``dY = T^T dU'``, ``dT = dW X^T + dU' Y^T`` and ``dA = -T^T dT
T^T``.

Matmul flops per head and chunk (``2 m n k`` each; ``C`` tokens, ``S =
16``; ``T`` the inverse, per row block ``2 S C S`` to pick ``A_ii``,
``log2 S`` levels of two ``[S, S]`` products, ``2 S C^2`` for ``A_i T``
and ``2 S^2 C`` for ``T_ii (.)``, each product counted once per pair of
bfloat16 parts it runs on: 5.6 C^3 for bfloat16 inputs at C = 128):

    wy          2 C^2 K + T + 2 C^2 (K + V)            A; T; W, U'
    sweep       4 C K V                                W h, U^T k
    sweep_grads 6 C K V                                k dh, q^T do, dU^T W
    wy_grads    2 C^2 K + T + 4 C^2 (K + V) + 4 C^3 + 4 C^2 K
                                   A; T; dT, dX, dY; dA; dA k, dA^T k

(``_wy_flops`` has the exact count; the outputs', ``dv``'s and grads'
kernels are ``gated_linear/tpu_chunks.py``'s.)

Registers: every ``[C, C]`` and ``[C, 128]`` product goes to VMEM
scratch, the elementwise work runs by strips of 32 rows, and float32
products by strips of 32 rows of their left operand (``tpu_chunks.
dot_into``) or, contracting over the chunk's rows (``TN``), as sums over
strips added to VMEM (``tpu_chunks.tn_into``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common import dots
from pallas_kernels.gated_linear import layout
from pallas_kernels.gated_linear import tpu_chunks as tc

_F32 = jnp.float32
NN, NT, TN = tc.NN, tc.NT, tc.TN
# Rows per block of the inverse's forward substitution (and the size of
# the diagonal blocks inverted by doubling).
INVERSE_BLOCK = 16


def _parts(spec: tc.Spec) -> tuple[int, int]:
  """The bfloat16 parts of ``A`` and of ``T`` in the inverse's products
  (``dots.split_dot``): ``A`` rounded to bfloat16 (one part; a rounding of
  the size of the inputs' own) and ``T`` in two parts for bfloat16
  inputs, three parts each (float32 accuracy) for float32 inputs."""
  return (1, 2) if spec.bf16 else (3, 3)


def _products(parts: tuple[int, int]) -> int:
  """The number of bfloat16 products ``dots.split_dot`` runs."""
  n = max(parts)
  return sum(1 for i in range(parts[0]) for j in range(parts[1])
             if i + j < n)


def _key_scores(r, spec: tc.Spec, lay: tc.Layout):
  """``A_k`` (the keys' scores with themselves on the strictly lower pairs
  of one document, with their decays) to the float32 scratch ``ak`` and
  ``A = diag(b) A_k`` to ``a``."""
  c = spec.chunk
  keys = {**r, "q": r["k"]}
  if spec.gate == "channel":
    s = spec.sub_chunk

    def row_block(i, carry):
      a = tc.block_scores(keys, spec, lay, i)     # then the mask
      keep = tc.pair_mask(r, spec, i, s) & tc.strictly_lower(s, c, i)
      rows = tc.at_block(i, s)
      a = jnp.where(keep, a, 0.0)
      r["ak"][rows, :] = a
      r["a"][rows, :] = (a * r["beta"][rows, :]).astype(r["a"].dtype)
      return carry

    tc.loop(c // s, row_block, 0)
    return
  tc.score_products(keys, spec, lay, grads=False)               # s = k k^T

  def strip(i, carry):
    rows = tc.at_block(i, lay.strip)
    a = r["s"][rows, :] * tc.pair_weights(r, spec, i, lay.strip)
    a = jnp.where(tc.strictly_lower(lay.strip, c, i), a, 0.0)
    r["ak"][rows, :] = a
    r["a"][rows, :] = (a * r["beta"][rows, :]).astype(r["a"].dtype)
    return carry

  tc.loop(c // lay.strip, strip, 0)


def block_inverse(a, parts: tuple[int, int]):
  """``(I + a)^{-1}`` of a strictly lower ``a [S, S]`` (``S`` a power of
  two) by the doubling formula: with ``T_s`` block-diagonal in blocks of
  ``s``, ``T_2s = T_s - T_s (a at level s) T_s``; ``parts``: of ``a`` and
  of ``T`` (``_parts``)."""
  n = a.shape[0]
  xor = jax.lax.bitwise_xor(tc.iota((n, n), 0), tc.iota((n, n), 1))
  t = (xor == 0).astype(_F32)
  size = 1
  a_parts, t_parts = parts
  while size < n:
    # Level s: s <= i ^ j < 2 s.
    level = jax.lax.shift_right_logical(xor, size.bit_length() - 1) == 1
    off = jnp.where(level, a, 0.0)
    t_off = dots.split_dot(t, off, NN, (t_parts, a_parts))
    t = t - dots.split_dot(t_off, t, NN, (t_parts, t_parts))
    size *= 2
  return t


def _inverse(r, spec: tc.Spec):
  """``T = (I + A)^{-1}`` to the float32 scratch ``t`` (from ``a``), by
  forward substitution over row blocks (module docstring)."""
  c = spec.chunk
  s = min(INVERSE_BLOCK, c)
  parts = _parts(spec)
  a_parts, t_parts = parts
  r["t"][...] = jnp.zeros(r["t"].shape, _F32)

  def block(i, carry):
    rows = tc.at_block(i, s)
    strip = r["a"][rows, :].astype(_F32)                        # [S, C]
    pick = (tc.iota((c, s), 0) == tc.iota((c, s), 1) + i * s).astype(_F32)
    a_ii = dots.split_dot(strip, pick, NN, (a_parts, 1))
    t_ii = block_inverse(a_ii, parts)
    eye = (tc.iota((s, c), 1) == tc.iota((s, c), 0) + i * s).astype(_F32)
    rhs = eye - dots.split_dot(strip, r["t"][...], NN, parts)
    r["t"][rows, :] = dots.split_dot(t_ii, rhs, NN, (t_parts, t_parts))
    return carry

  tc.loop(c // s, block, 0)


def _t_operand(r, spec: tc.Spec) -> str:
  """The name of ``T`` as a matmul operand: ``t_op`` (bfloat16) for
  bfloat16 inputs, else the float32 ``t``."""
  if spec.bf16:
    r["t_op"][...] = r["t"][...].astype(jnp.bfloat16)
    return "t_op"
  return "t"


def _read_keys(r, spec: tc.Spec, lay: tc.Layout, cols, *, raw: str | None):
  """``X = b read exp(P) k`` at the key columns ``cols`` to the scratch
  ``x`` (a matmul operand) and, with ``raw``, ``read exp(P) k`` to the
  float32 scratch ``raw``."""
  def body(rows):
    w = tc.chunk_weights(r, spec, cols, rows).read
    xk = r["k"][rows, cols].astype(_F32) * w
    r["x"][rows, :] = tc.operand(xk * r["beta"][rows, :], spec)
    if raw:
      r[raw][rows, :] = xk

  tc.by_strips(spec, lay, body)


def _weighted_values(r, spec: tc.Spec, lay: tc.Layout, cols):
  """``Y = b v`` at the value columns ``cols`` to the scratch ``x`` (a
  matmul operand), by strips."""
  def body(rows):
    y = r["v"][rows, cols].astype(_F32) * r["beta"][rows, :]
    r["x"][rows, :] = tc.operand(y, spec)

  tc.by_strips(spec, lay, body)


def _wy_kernel(r, *, spec: tc.Spec, lay: tc.Layout):
  _key_scores(r, spec, lay)
  _inverse(r, spec)
  t = _t_operand(r, spec)

  def key_step(j, carry):
    cols = tc.at_block(j, lay.step)
    _read_keys(r, spec, lay, cols, raw=None)
    tc.dot_into(r, "acc", t, lambda: r["x"][...], NN, spec, lay)
    r["w"][:, cols] = r["acc"][...].astype(r["w"].dtype)
    return carry

  tc.loop(lay.k_pad // lay.step, key_step, 0)

  def value_step(j, carry):
    cols = tc.at_block(j, lay.step)
    _weighted_values(r, spec, lay, cols)
    tc.dot_into(r, "acc", t, lambda: r["x"][...], NN, spec, lay)
    r["u"][:, cols] = r["acc"][...].astype(r["u"].dtype)
    return carry

  tc.loop(lay.v_pad // lay.step, value_step, 0)


def _wy_scratch(spec: tc.Spec, lay: tc.Layout):
  """The scratch that ``_key_scores``, ``_inverse`` and ``_t_operand``
  share."""
  c = lay.chunk
  scratch = [("ak", (c, c), _F32), ("t", (c, c), _F32),
             ("a", (c, c), jnp.bfloat16 if spec.bf16 else _F32)]
  if spec.bf16:
    scratch.append(("t_op", (c, c), jnp.bfloat16))
  if spec.gate == "channel":
    scratch += [("e", (c, lay.step), _F32),
                ("ke", (c, lay.step), tc.operand_dtype(spec))]
  else:
    scratch.append(("s", (c, c), _F32))
  return scratch


def beta_to_kernel(beta, lay: tc.Layout):
  """``[B, T, H]`` -> ``[B, H, T_pad, 1]`` float32 (zero on padding: a
  padded token writes nothing)."""
  return layout.to_kernel(beta[..., None], lay, 1, _F32)


def _chunk_inputs(arrays, lay: tc.Layout):
  """The WY kernels' inputs (``k``, ``v``, ``beta``, the gates and the
  documents) and the chunk kernels' block specs."""
  specs = tc.chunk_specs(lay)
  inputs = {"k": (arrays["k"], specs["k"]), "v": (arrays["v"], specs["v"]),
            "beta": (arrays["beta"], specs["column"])}
  inputs.update(tc.gate_and_doc_inputs(arrays, specs, tc.GATE_AND_DOC_KINDS))
  return inputs, specs


def _wy_flops(spec: tc.Spec, lay: tc.Layout, *, backward: bool) -> int:
  """Matmul flops of the WY kernels per head and chunk, counted from their
  bodies (the split products' parts counted one by one)."""
  c, k, v = lay.chunk, lay.k_pad, lay.v_pad
  s = min(INVERSE_BLOCK, c)
  levels = s.bit_length() - 1
  a_parts, t_parts = parts = _parts(spec)
  products = _products
  per_block = (products((a_parts, 1)) * 2 * s * c * s      # pick A_ii
               + levels * (products((t_parts, a_parts))
                           + products((t_parts, t_parts))) * 2 * s ** 3
               + products(parts) * 2 * s * c * c           # A_i T
               + products((t_parts, t_parts)) * 2 * s * s * c)  # T_ii rhs
  inverse = (c // s) * per_block
  scores = 2 * c * c * k
  if not backward:
    return scores + inverse + 2 * c * c * (k + v)
  pairs = (_channel_pair_flops(spec, lay) if spec.gate == "channel"
           else 2 * 2 * c * c * k)
  return (scores + inverse + 2 * 2 * c * c * (k + v)         # dT; dX, dY
          + 2 * 2 * c ** 3 + pairs)                         # dA; dA k


def _channel_pair_flops(spec: tc.Spec, lay: tc.Layout) -> int:
  """``_channel_pair_grads``' products per chunk: per row block and key
  step ``[S, C] x [C, BK]`` and ``[S, C]^T x [S, BK]``."""
  c, s = lay.chunk, spec.sub_chunk
  return (c // s) * 2 * (2 * s * c * lay.k_pad)


def wy(arrays, spec: tc.Spec, lay: tc.Layout, *, interpret: bool):
  """``{"w": [B, H, T_pad, K_pad], "u": [B, H, T_pad, V_pad]}`` in the
  matmul dtype: ``W`` and ``U'`` of every chunk."""
  inputs, specs = _chunk_inputs(arrays, lay)
  b, h, t = lay.batch, lay.heads, lay.t_pad
  dtype = tc.operand_dtype(spec)
  out = {"w": (jax.ShapeDtypeStruct((b, h, t, lay.k_pad), dtype), specs["k"]),
         "u": (jax.ShapeDtypeStruct((b, h, t, lay.v_pad), dtype), specs["v"])}
  scratch = _wy_scratch(spec, lay) + [
      ("x", (lay.chunk, lay.step), dtype),
      ("acc", (lay.chunk, lay.step), _F32)]
  return _wy_call(_wy_kernel, spec, lay, inputs, out, scratch,
                  backward=False, interpret=interpret)


def _wy_call(kernel, spec, lay, inputs, out, scratch, *, backward: bool,
             interpret: bool):
  """The WY kernel (``backward``: its gradient) over ``(B, H, N)``."""
  return tc.call(functools.partial(kernel, spec=spec, lay=lay),
                 (lay.batch, lay.heads, lay.chunks), inputs, out,
                 parallel=3, scratch=scratch,
                 name="delta_rule_tpu_wy_grads" if backward
                 else "delta_rule_tpu_wy",
                 cost=_cost(spec, lay, _wy_flops(spec, lay,
                                                 backward=backward),
                            inputs, out),
                 interpret=interpret)


def _cost(spec: tc.Spec, lay: tc.Layout, flops_per_chunk: int, inputs,
          outputs, *, chunk_kernel: bool = True):
  """A kernel's estimate: its matmul flops, the ``exp``s of its weights and
  the bytes of its inputs and outputs."""
  chunks = lay.batch * lay.heads * lay.chunks
  width = lay.k_pad if spec.gate == "channel" else 1
  exps = 0 if spec.gate == "none" else (
      (2 * lay.chunk + 1) * width + (lay.chunk ** 2 if chunk_kernel else 0))
  arrays = [x for x, _ in list(inputs.values()) + list(outputs.values())]
  return tc.compiler.cost(flops=flops_per_chunk * chunks,
                          transcendentals=exps * chunks, arrays=arrays)


# --- The sweeps over chunks ---------------------------------------------


def _sweep_specs(lay: tc.Layout, reverse: bool):
  """Block specs of the sweeps, grid ``(b, h, vb, step)``."""
  c, bv, n, k = lay.chunk, lay.sweep_v, lay.chunks, lay.k_pad

  def chunk(s):
    return n - 1 - s if reverse else s

  def spec(shape, index):
    return pl.BlockSpec(shape, index)

  return {
      "k": spec((None, None, c, k), lambda b, h, vb, s: (b, h, chunk(s), 0)),
      "v": spec((None, None, c, bv),
                lambda b, h, vb, s: (b, h, chunk(s), vb)),
      "column": spec((None, None, c, 1),
                     lambda b, h, vb, s: (b, h, chunk(s), 0)),
      "doc": spec((None, c, 1), lambda b, h, vb, s: (b, chunk(s), 0)),
      "state": spec((None, None, bv, k), lambda b, h, vb, s: (b, h, vb, 0)),
      "states": spec((None, None, None, bv, k),
                     lambda b, h, vb, s: (b, h, chunk(s), vb, 0)),
  }


def _begin_chunk(r, lay: tc.Layout):
  """A sweep's chunk: the state set up at the first, the state written to
  this chunk's ``states`` block and ``acc`` zeroed; ``(step, key
  blocks)``."""
  step = pl.program_id(3)
  tc.init_state(r, step)
  n_k = lay.k_pad // lay.step
  _store_states(r, lay, n_k)
  r["acc"][...] = jnp.zeros(r["acc"].shape, _F32)
  return step, n_k


def _carry(r, spec: tc.Spec, cols):
  c = spec.chunk
  return tc.chunk_weights(r, spec, cols, pl.ds(c - 1, 1)).carry


def _store_states(r, lay: tc.Layout, n_k: int):
  """The state (``[BV, K]``) to this chunk's ``states`` block, key block by
  key block."""
  def key_step(j, carry):
    cols = tc.at_block(j, lay.step)
    r["states"][:, cols] = r["state"][:, cols].astype(r["states"].dtype)
    return carry

  tc.loop(n_k, key_step, 0)


def _final_state(r, lay: tc.Layout, n_k: int, step, last_step: int):
  if "state_out" not in r:
    return

  @pl.when(step == last_step)
  def _():
    def key_step(j, carry):
      cols = tc.at_block(j, lay.step)
      r["state_out"][:, cols] = r["state"][:, cols]
      return carry

    tc.loop(n_k, key_step, 0)


def _delta_sweep_kernel(r, *, spec: tc.Spec, lay: tc.Layout,
                        last_step: int):
  """One chunk of the forward sweep: the state entering it, ``U = U' - W
  h^T``, then ``h <- carry h + U^T (write k)``, by key blocks."""
  step, n_k = _begin_chunk(r, lay)

  def read(j, carry):
    cols = tc.at_block(j, lay.step)
    tc.dot_into(r, "acc", "w", lambda: r["state"][:, cols], NT, spec, lay,
                add=True, lhs_cols=cols)                          # W h^T
    return carry

  tc.loop(n_k, read, 0)

  def body(rows):
    u = r["u_prime"][rows, :].astype(_F32) - r["acc"][rows, :]
    r["u"][rows, :] = u.astype(r["u"].dtype)

  tc.by_strips(spec, lay, body)

  def update(j, carry):
    cols = tc.at_block(j, lay.step)
    tc.weighted(r, spec, lay, cols, "kw", "k", "write")
    r["state"][:, cols] = r["state"][:, cols] * _carry(r, spec, cols)
    tc.tn_into(r, spec, lay, "state", "u", "kw", out_cols=cols)
    return carry

  tc.loop(n_k, update, 0)
  _final_state(r, lay, n_k, step, last_step)


def _sweep_call(kernel, arrays, spec, lay, named, *, reverse: bool,
                state_in, state_out: bool, extra_outputs, name: str,
                flops: int, interpret: bool):
  specs = _sweep_specs(lay, reverse)
  inputs = {n: (x, specs[kind]) for n, (x, kind) in named.items()}
  inputs.update(tc.gate_and_doc_inputs(arrays, specs,
                                       ("p_hi", "p_lo", "doc", "doc_prev")))
  if state_in is not None:
    inputs["state_in"] = (state_in, specs["state"])
  b, h = lay.batch, lay.heads
  outputs = {"states": (jax.ShapeDtypeStruct(
      (b, h, lay.chunks, lay.v_pad, lay.k_pad), tc.operand_dtype(spec)),
      specs["states"])}
  outputs.update({n: (shape, specs[kind])
                  for n, (shape, kind) in extra_outputs.items()})
  if state_out:
    outputs["state_out"] = (jax.ShapeDtypeStruct(
        (b, h, lay.v_pad, lay.k_pad), _F32), specs["state"])
  c, bv = lay.chunk, lay.sweep_v
  dtype = tc.operand_dtype(spec)
  scratch = [("state", (bv, lay.k_pad), _F32), ("acc", (c, bv), _F32),
             ("kw", (c, lay.step), dtype)]
  if reverse:
    scratch += [("qr", (c, lay.step), dtype), ("du_op", (c, bv), dtype)]
  grid = (b, h, lay.v_pad // bv, lay.chunks)
  return tc.call(
      functools.partial(kernel, spec=spec, lay=lay,
                        last_step=lay.chunks - 1),
      grid, inputs, outputs, parallel=3, scratch=scratch, name=name,
      cost=_cost(spec, lay, flops, inputs, outputs, chunk_kernel=False),
      interpret=interpret)


def delta_sweep(arrays, w, u_prime, spec: tc.Spec, lay: tc.Layout, *,
                state_in=None, state_out: bool, interpret: bool):
  """``{"states": h [B, H, N, V_pad, K_pad]`` (the state entering each
  chunk, in the matmul dtype), ``"u": U [B, H, T_pad, V_pad]}`` and the
  final state (``state_out``, float32 ``[B, H, V_pad, K_pad]``)."""
  b, h = lay.batch, lay.heads
  return _sweep_call(
      _delta_sweep_kernel, arrays, spec, lay,
      {"k": (arrays["k"], "k"), "w": (w, "k"), "u_prime": (u_prime, "v")},
      reverse=False, state_in=state_in, state_out=state_out,
      extra_outputs={"u": (jax.ShapeDtypeStruct(
          (b, h, lay.t_pad, lay.v_pad), tc.operand_dtype(spec)), "v")},
      name="delta_rule_tpu_sweep",
      flops=2 * 2 * lay.chunk * lay.k_pad * lay.v_pad, interpret=interpret)


def _delta_sweep_grad_kernel(r, *, spec: tc.Spec, lay: tc.Layout,
                             last_step: int):
  """One chunk of the reverse sweep: ``dh`` (the gradient of the state
  leaving the chunk), ``dU = du_intra + (write k) dh^T``, then ``dh <-
  carry dh + do^T (scale read q) - dU^T W``."""
  step, n_k = _begin_chunk(r, lay)

  def write(j, carry):
    cols = tc.at_block(j, lay.step)
    tc.weighted(r, spec, lay, cols, "kw", "k", "write")
    tc.dot_into(r, "acc", "kw", lambda: r["state"][:, cols], NT, spec, lay,
                add=True)
    return carry

  tc.loop(n_k, write, 0)

  def body(rows):
    du = r["du_intra"][rows, :] + r["acc"][rows, :]
    r["du"][rows, :] = du
    r["du_op"][rows, :] = du.astype(r["du_op"].dtype)

  tc.by_strips(spec, lay, body)

  def update(j, carry):
    cols = tc.at_block(j, lay.step)
    tc.weighted(r, spec, lay, cols, "qr", "q", "read", spec.scale)
    r["state"][:, cols] = r["state"][:, cols] * _carry(r, spec, cols)
    tc.tn_into(r, spec, lay, "state", "do", "qr", out_cols=cols)
    tc.tn_into(r, spec, lay, "state", "du_op", "w", out_cols=cols,
               rhs_cols=cols, sign=-1.0)
    return carry

  tc.loop(n_k, update, 0)
  _final_state(r, lay, n_k, step, last_step)


def delta_sweep_grads(arrays, w, du_intra, spec: tc.Spec, lay: tc.Layout, *,
                      state_in=None, state_out: bool, interpret: bool):
  """The reverse sweep: ``{"states": dh [B, H, N, V_pad, K_pad]`` (the
  gradient of the state leaving each chunk), ``"du"`` (the pseudo-values'
  whole gradient, float32)}`` and the initial state's gradient
  (``state_out``); ``state_in``: the final state's gradient."""
  b, h = lay.batch, lay.heads
  return _sweep_call(
      _delta_sweep_grad_kernel, arrays, spec, lay,
      {"q": (arrays["q"], "k"), "k": (arrays["k"], "k"), "w": (w, "k"),
       "do": (arrays["do"], "v"), "du_intra": (du_intra, "v")},
      reverse=True, state_in=state_in, state_out=state_out,
      extra_outputs={"du": (jax.ShapeDtypeStruct(
          (b, h, lay.t_pad, lay.v_pad), _F32), "v")},
      name="delta_rule_tpu_sweep_grads",
      flops=3 * 2 * lay.chunk * lay.k_pad * lay.v_pad, interpret=interpret)


# --- The WY terms' gradient -----------------------------------------------


def _wy_grads_kernel(r, *, spec: tc.Spec, lay: tc.Layout):
  """What ``W`` and ``U'`` send to ``k``, ``v``, ``b`` and the log-decays
  through ``T = (I + A)^{-1}``:

      dX = T^T dW,  dY = T^T dU,  dT = dW X^T + dU Y^T,
      dA = -T^T dT T^T (on the strictly lower pairs of one document),

  with ``X = b read exp(P) k``, ``Y = b v``, ``A = diag(b) A_k``; ``dA_k =
  diag(b) dA`` is a gradient of the keys' scores with themselves, sent to
  both sides (rows and columns)."""
  c = spec.chunk
  _key_scores(r, spec, lay)
  _inverse(r, spec)
  t = _t_operand(r, spec)
  channel = spec.gate == "channel"
  r["dt"][...] = jnp.zeros(r["dt"].shape, _F32)
  column = jnp.zeros((c, 1), _F32)

  # Per-token sums in the scratch columns: dbeta in col_acc, the scalar
  # log-decays' rows in row_acc.
  r["col_acc"][...] = column
  r["row_acc"][...] = column

  def key_step(j, carry):
    cols = tc.at_block(j, lay.step)
    _read_keys(r, spec, lay, cols, raw="xk")
    r["g_op"][...] = tc.operand(r["dw"][:, cols], spec)
    tc.dot_into(r, "dt", "g_op", lambda: r["x"][...], NT, spec, lay,
                add=True)                                       # dW X^T
    tc.tn_into(r, spec, lay, "dx", t, "g_op", add=False)         # T^T dW

    def strip(rows):
      dx, xk = r["dx"][rows, :], r["xk"][rows, :]
      beta = r["beta"][rows, :]
      r["dk"][rows, cols] = dx * beta * tc.chunk_weights(
          r, spec, cols, rows).read
      rows_x = xk * beta * dx                                   # X dX
      if channel:
        r["gate_rows"][rows, cols] = rows_x
      else:
        r["row_acc"][rows, :] += jnp.sum(rows_x, axis=1, keepdims=True)
      r["col_acc"][rows, :] += jnp.sum(dx * xk, axis=1, keepdims=True)

    tc.by_strips(spec, lay, strip)
    return carry

  tc.loop(lay.k_pad // lay.step, key_step, 0)

  def value_step(j, carry):
    cols = tc.at_block(j, lay.step)
    _weighted_values(r, spec, lay, cols)
    r["g_op"][...] = tc.operand(r["du"][:, cols], spec)
    tc.dot_into(r, "dt", "g_op", lambda: r["x"][...], NT, spec, lay,
                add=True)                                       # dU Y^T
    tc.tn_into(r, spec, lay, "dx", t, "g_op", add=False)         # dY

    def strip(rows):
      dy = r["dx"][rows, :]
      r["dv"][rows, cols] = dy * r["beta"][rows, :]
      r["col_acc"][rows, :] += jnp.sum(
          dy * r["v"][rows, cols].astype(_F32), axis=1, keepdims=True)

    tc.by_strips(spec, lay, strip)
    return carry

  tc.loop(lay.v_pad // lay.step, value_step, 0)
  # dA = -T^T dT T^T, in the inputs' matmul mode.
  dt, m = "dt", "m"
  if spec.bf16:
    dt, m = "dt_op", "m_op"
    r[dt][...] = r["dt"][...].astype(jnp.bfloat16)
  tc.tn_into(r, spec, lay, "m", t, dt, add=False)               # T^T dT
  if spec.bf16:
    r[m][...] = r["m"][...].astype(jnp.bfloat16)
  tc.dot_into(r, "da", m, lambda: r[t][...], NT, spec, lay)     # (.) T^T

  def pair_strip(i, col_sums):
    rows = tc.at_block(i, lay.strip)
    keep = tc.pair_mask(r, spec, i, lay.strip) & tc.strictly_lower(
        lay.strip, c, i)
    da = jnp.where(keep, -r["da"][rows, :], 0.0)                # dA
    ak = r["ak"][rows, :]
    r["col_acc"][rows, :] += jnp.sum(da * ak, axis=1, keepdims=True)
    da_k = da * r["beta"][rows, :]                              # dA_k
    if channel:
      r["da"][rows, :] = da_k
      return col_sums
    weights = tc.pair_weights(r, spec, i, lay.strip)
    r["da_op"][rows, :] = tc.operand(da_k * weights, spec)
    if spec.gate != "scalar":
      return col_sums
    terms = da_k * ak
    r["row_acc"][rows, :] += jnp.sum(terms, axis=1, keepdims=True)
    return col_sums + jnp.sum(terms, axis=0, keepdims=True)

  col_sums = tc.loop(c // lay.strip, pair_strip, jnp.zeros((1, c), _F32))
  r["dbeta"][...] = r["col_acc"][...]
  if channel:
    _channel_pair_grads(r, spec, lay)
    return
  if spec.gate == "scalar":
    r["gate_rows"][...] = r["row_acc"][...]
    r["gate_cols"][...] = col_sums

  def pair_step(j, carry):
    cols = tc.at_block(j, lay.step)
    tc.dot_into(r, "acc", "da_op", lambda: r["k"][:, cols], NN, spec, lay)
    r["dk"][:, cols] += r["acc"][...] + tc.dot(
        r["da_op"][...], r["k"][:, cols], TN, spec)
    return carry

  tc.loop(lay.k_pad // lay.step, pair_step, 0)


def _channel_pair_grads(r, spec: tc.Spec, lay: tc.Layout):
  """The pairs' part of ``dk`` and of the log-decays' rows for a decay per
  key channel, from ``dA_k`` in the scratch ``da``: ``A_k[i, j] = sum_c
  k_ic k_jc exp(P_ic - P_jc)`` sends ``dA_k[i, j] k_jc e_ijc`` to ``k_ic``
  (rows) and ``dA_k[i, j] k_ic e_ijc`` to ``k_jc`` (columns), by the row
  blocks of ``tc.RowBlock`` (through the token before the block, then key
  by key inside it); the log-decays' rows take ``k (rows - columns)``."""
  s, c = spec.sub_chunk, spec.chunk
  keys = {**r, "q": r["k"]}
  r["dk_pairs"][...] = jnp.zeros(r["dk_pairs"].shape, _F32)

  def row_block(i, carry):
    da = r["da"][tc.at_block(i, s), :]                          # [S, C]
    da_op = tc.operand(da, spec)

    def key_step(j, carry):
      tc.RowBlock(keys, spec, lay, i, tc.at_block(j, lay.step)).pair_grads(
          da, da_op)
      return carry

    tc.loop(lay.k_pad // lay.step, key_step, 0)
    return carry

  tc.loop(c // s, row_block, 0)

  def key_step(j, carry):
    cols = tc.at_block(j, lay.step)

    def body(rows):
      k = r["k"][rows, cols].astype(_F32)
      rows_k, cols_k = r["dq_pairs"][rows, cols], r["dk_pairs"][rows, cols]
      r["dk"][rows, cols] += rows_k + cols_k
      r["gate_rows"][rows, cols] += k * (rows_k - cols_k)

    tc.by_strips(spec, lay, body)
    return carry

  tc.loop(lay.k_pad // lay.step, key_step, 0)


def wy_grads(arrays, dw, du, spec: tc.Spec, lay: tc.Layout, *,
             interpret: bool):
  """``{"dk", "dv", "dbeta"}`` (float32; ``dbeta`` ``[B, H, T_pad, 1]``)
  and, with a decay, the log-decays' terms (``gate_rows`` and, for a
  scalar decay, ``gate_cols``, as ``tc.grads`` writes them): what ``W``
  and ``U'`` send back, from their gradients ``dw [B, H, T_pad, K_pad]``
  and ``du [B, H, T_pad, V_pad]``."""
  inputs, specs = _chunk_inputs(arrays, lay)
  inputs["dw"] = (dw, specs["k"])
  inputs["du"] = (du, specs["v"])
  b, h, t, c = lay.batch, lay.heads, lay.t_pad, lay.chunk
  out = {"dk": (jax.ShapeDtypeStruct((b, h, t, lay.k_pad), _F32),
                specs["k"]),
         "dv": (jax.ShapeDtypeStruct((b, h, t, lay.v_pad), _F32),
                specs["v"]),
         "dbeta": (jax.ShapeDtypeStruct((b, h, t, 1), _F32),
                   specs["column"])}
  if spec.gate == "scalar":
    out["gate_rows"] = (jax.ShapeDtypeStruct((b, h, t, 1), _F32),
                        specs["column"])
    out["gate_cols"] = (jax.ShapeDtypeStruct((b, h, lay.chunks, 1, c),
                                             _F32), specs["row"])
  elif spec.gate == "channel":
    out["gate_rows"] = (jax.ShapeDtypeStruct((b, h, t, lay.k_pad), _F32),
                        specs["k"])
  dtype = tc.operand_dtype(spec)
  step = lay.step
  scratch = _wy_scratch(spec, lay) + [
      ("x", (c, step), dtype), ("xk", (c, step), _F32),
      ("g_op", (c, step), dtype), ("dx", (c, step), _F32),
      ("acc", (c, step), _F32), ("dt", (c, c), _F32), ("m", (c, c), _F32),
      ("da", (c, c), _F32), ("col_acc", (c, 1), _F32),
      ("row_acc", (c, 1), _F32)]
  if spec.bf16:
    scratch += [("dt_op", (c, c), dtype), ("m_op", (c, c), dtype)]
  if spec.gate == "channel":
    scratch += [("dq_pairs", (c, lay.k_pad), _F32),
                ("dk_pairs", (c, lay.k_pad), _F32),
                ("dk_tmp", (c, step), _F32)]
  else:
    scratch.append(("da_op", (c, c), dtype))
  return _wy_call(_wy_grads_kernel, spec, lay, inputs, out, scratch,
                  backward=True, interpret=interpret)
