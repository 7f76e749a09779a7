"""Regenerates the op reference fixtures of tests/ops (``tests/fixtures/ops``).

For every op whose definition comes from an outside reference (fla's
``naive.py``, or a paper's equations written in NumPy), one ``<name>.npz``
holding random inputs and the reference's outputs (and, where the
reference has them, final states and gradients), in float32. The tests
run the library's naive form on the same inputs and compare; the fixtures
need nothing but NumPy to read.

Needs the ``hf`` extra (CPU torch, flash-linear-attention) for the fla
references:

  pip install -e '.[hf]'
  python -m experiments.make_op_fixtures --only=NAME

Each entry of ``FIXTURES`` is a function ``() -> dict`` of NumPy arrays;
the arrays go into ``<out>/<name>.npz`` as they are.
"""

from __future__ import annotations

import os

from absl import app, flags
import numpy as np

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's absl flags, defined when it runs (importing the module
  defines none)."""
  flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "..",
                                          "tests", "fixtures", "ops"),
                      "Directory of the fixtures (one .npz per entry).")
  flags.DEFINE_list("only", [], "Make only these fixtures (names as in "
                    "FIXTURES).")


SEED = 0
FIXTURES = {}


def fixture(name: str):
  """Registers ``fn`` as the maker of ``<name>.npz``."""
  def register(fn):
    FIXTURES[name] = fn
    return fn
  return register


# Stick-breaking attention: the cases of the fixture, as (name, query scale,
# attend_current). A query scale of 30 saturates the logits (|z| ~ 30).
STICKBREAKING_CASES = (("plain", 1.0, False), ("current", 1.0, True),
                       ("strong", 30.0, False), ("strong_current", 30.0,
                                                 True))


@fixture("stickbreaking_attn")
def stickbreaking_attn():
  """fla's ``naive_stickbreaking_attn`` on grouped heads (4 query heads, 2
  key/value heads), K != V, T = 19, for each case of
  ``STICKBREAKING_CASES``: ``<case>_{q,k,v}`` (float32), its ``o`` and
  ``rem``, and the gradients ``d{q,k,v}`` of ``sum(o * do) + sum(rem *
  drem)`` for the stored cotangents. The reference runs in float64 on the
  float32 inputs (fla's naive form keeps float64 inputs in float64)."""
  import torch
  from fla.ops.stickbreaking_attn.naive import naive_stickbreaking_attn

  rng = np.random.default_rng(SEED)
  b, t, h, hkv, dk, dv = 2, 19, 4, 2, 8, 6
  arrays = {}
  for name, q_scale, attend_current in STICKBREAKING_CASES:
    inputs = {"q": q_scale * rng.standard_normal((b, t, h, dk)),
              "k": rng.standard_normal((b, t, hkv, dk)),
              "v": rng.standard_normal((b, t, hkv, dv)),
              "do": rng.standard_normal((b, t, h, dv)),
              "drem": rng.standard_normal((b, t, h))}
    inputs = {n: x.astype(np.float32) for n, x in inputs.items()}
    q, k, v = (torch.tensor(inputs[n], dtype=torch.float64,
                            requires_grad=True) for n in ("q", "k", "v"))
    o, rem = naive_stickbreaking_attn(q, k, v, attend_current=attend_current)
    loss = ((o * torch.tensor(inputs["do"], dtype=torch.float64)).sum()
            + (rem * torch.tensor(inputs["drem"], dtype=torch.float64)).sum())
    loss.backward()
    outputs = {"o": o, "rem": rem, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    for n, x in {**inputs, **outputs}.items():
      arrays[f"{name}_{n}"] = np.asarray(
          x.detach().numpy() if isinstance(x, torch.Tensor) else x,
          np.float32)
  return arrays
def _fla_forgetting_attn(rng, *, batch, length, heads, heads_kv, dim,
                         window_size, scale):
  """Random inputs and fla's ``naive_forgetting_attn`` of them."""
  import torch
  from fla.ops.forgetting_attn.naive import naive_forgetting_attn

  q = rng.standard_normal((batch, length, heads, dim), np.float32)
  k = rng.standard_normal((batch, length, heads_kv, dim), np.float32)
  v = rng.standard_normal((batch, length, heads_kv, dim), np.float32)
  logits = rng.standard_normal((batch, length, heads), np.float32) + 1.0
  g = -np.logaddexp(0.0, -logits).astype(np.float32)        # log sigmoid
  o = naive_forgetting_attn(*(torch.from_numpy(x) for x in (q, k, v, g)),
                            scale=scale, window_size=window_size)
  return dict(q=q, k=k, v=v, g=g, o=o.numpy(), scale=np.float32(scale),
              window=np.int64(window_size or 0))


@fixture("forgetting_attn")
def forgetting_attn():
  """fla's ``naive_forgetting_attn`` (``fla/ops/forgetting_attn/naive.py``)
  with four query heads on two key/value heads: ``full`` causal attention
  over 45 tokens, and a ``window`` of 7 over 40 (``window=0``: none)."""
  rng = np.random.default_rng(SEED)
  cases = {
      "full": _fla_forgetting_attn(rng, batch=2, length=45, heads=4,
                                   heads_kv=2, dim=16, window_size=None,
                                   scale=0.25),
      "window": _fla_forgetting_attn(rng, batch=2, length=40, heads=4,
                                     heads_kv=2, dim=8, window_size=7,
                                     scale=0.3),
  }
  return {f"{case}_{name}": x for case, arrays in cases.items()
          for name, x in arrays.items()}


@fixture("nsa")
def nsa():
  """fla's ``naive_nsa`` on random inputs: ``dense_*`` two rows of 37
  tokens, 32 query heads in 2 groups of 16 (the group size fla's NSA
  asserts), blocks of 4, 5 selected, a window of 5; ``docs_*`` one row of
  three documents (``cu_seqlens``, as ``segment_ids`` for the library),
  16 query heads on one key/value head, 4 selected, a window of 6. Gates
  are sigmoids, the scale the default."""
  import torch
  from experiments.fla_nsa_reference import naive_nsa_on_cpu
  naive_nsa = naive_nsa_on_cpu()
  rng = np.random.default_rng(SEED)
  arrays = {}
  for name, (b, t, h, hkv, counts, window, lengths) in {
      "dense": (2, 37, 32, 2, 5, 5, None),
      "docs": (1, 41, 16, 1, 4, 6, (11, 19, 11))}.items():
    dk, dv, block = 8, 6, 4
    x = {"q": rng.standard_normal((b, t, h, dk)),
         "k": rng.standard_normal((b, t, hkv, dk)),
         "v": rng.standard_normal((b, t, hkv, dv))}
    for gate in ("g_cmp", "g_slc", "g_swa"):
      x[gate] = 1 / (1 + np.exp(-rng.standard_normal((b, t, h))))
    x = {n: a.astype(np.float32) for n, a in x.items()}
    cu_seqlens = None
    if lengths is not None:
      cu_seqlens = torch.tensor(np.cumsum((0,) + lengths))
      x["segment_ids"] = np.repeat(np.arange(len(lengths)),
                                   lengths)[None].astype(np.int32)
    o = naive_nsa(*(torch.from_numpy(x[n]) for n in ("q", "k", "v", "g_cmp",
                                                     "g_slc", "g_swa")),
                  block_counts=counts, block_size=block, window_size=window,
                  cu_seqlens=cu_seqlens)
    x.update(o=o.numpy(), block_size=np.int64(block),
             block_counts=np.int64(counts), window_size=np.int64(window))
    arrays.update({f"{name}_{n}": a for n, a in x.items()})
  return arrays


def _torch_flash_attn():
  """flash-attn's varlen entry points as dense torch code (CPU).

  ``(varlen_func, varlen_forward, varlen_backward)`` with flash-attn's
  signatures: per pair of segments of ``cu_seqlens_q`` / ``cu_seqlens_k``,
  ``softmax(scale q k^T) v`` in float32 (causal: bottom-right aligned, as
  flash-attn), the forward returning the log-sum-exp ``[H, Tq]`` too and the
  backward writing ``dq, dk, dv`` from the given output and log-sum-exp (the
  merged ones, which is how MoBA's two passes share one softmax).
  """
  import torch

  def segments(cu_q, cu_k):
    return [(int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1]))
            for i in range(len(cu_q) - 1)]

  def scores(q, k, scale, causal):
    s = scale * torch.einsum("ihk,jhk->hij", q.float(), k.float())
    if causal:
      lq, lk = q.shape[0], k.shape[0]
      allowed = (torch.arange(lq)[:, None] + (lk - lq)
                 >= torch.arange(lk)[None, :])
      s = s.masked_fill(~allowed, float("-inf"))
    return s

  def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, causal, dropout_p, **unused):
    del max_seqlen_q, max_seqlen_k, dropout_p, unused
    out = torch.zeros(q.shape[:2] + v.shape[2:], dtype=torch.float32)
    lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32)
    for a, b, c, d in segments(cu_seqlens_q, cu_seqlens_k):
      s = scores(q[a:b], k[c:d], softmax_scale, causal)
      lse[:, a:b] = torch.logsumexp(s, dim=-1)
      p = torch.exp(s - lse[:, a:b, None])
      out[a:b] = torch.einsum("hij,jhv->ihv", p, v[c:d].float())
    return out.to(q.dtype), lse, None, None

  def varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv,
                      cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      softmax_scale, causal, dropout_p, **unused):
    del max_seqlen_q, max_seqlen_k, dropout_p, unused
    dq.zero_(), dk.zero_(), dv.zero_()
    for a, b, c, d in segments(cu_seqlens_q, cu_seqlens_k):
      s = scores(q[a:b], k[c:d], softmax_scale, causal)
      p = torch.exp(s - softmax_lse[:, a:b, None])              # [H, i, j]
      do = dout[a:b].float()
      dp = torch.einsum("ihv,jhv->hij", do, v[c:d].float())
      delta = torch.einsum("ihv,ihv->hi", do, out[a:b].float())
      ds = p * (dp - delta[..., None])
      dq[a:b] += softmax_scale * torch.einsum("hij,jhk->ihk", ds,
                                              k[c:d].float())
      dk[c:d] += softmax_scale * torch.einsum("hij,ihk->jhk", ds,
                                              q[a:b].float())
      dv[c:d] += torch.einsum("hij,ihv->jhv", p, do)

  def varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, causal=False, **unused):
    del max_seqlen_q, max_seqlen_k, unused
    scale = q.shape[-1] ** -0.5
    outs = []
    for a, b, c, d in segments(cu_seqlens_q, cu_seqlens_k):
      p = torch.softmax(scores(q[a:b], k[c:d], scale, causal), dim=-1)
      outs.append(torch.einsum("hij,jhv->ihv", p, v[c:d].float()))
    return torch.cat(outs).to(q.dtype)

  return varlen_func, varlen_forward, varlen_backward


@fixture("moba")
def moba():
  """fla's ``parallel_moba`` (``fla/ops/moba/parallel.py``) itself, run on
  CPU with flash-attn's three varlen entry points swapped for the dense
  torch code of ``_torch_flash_attn`` (fla's MoBA has no path without
  flash-attn): its chunking of the packed documents, block means, gate
  masks, ``torch.topk`` selection, two passes and log-sum-exp merge, and
  its backward, as they are.

  One row of four packed documents (``cu_seqlens``: lengths 23, 4, 37 and
  9, so partial last blocks, a document shorter than a block, several
  blocks per document), ``H = 2`` heads, ``K = V = 8`` (fla's output has
  q's width), and three cases ``<case>_*`` of ``(block_size, top_k)``:
  ``sparse`` (4, 3), ``full`` (4, 1), where fla's short-circuit runs plain
  causal attention per document, and ``all`` (8, 9), more blocks than any
  document has. Each case holds ``o`` and the gradients ``dq``, ``dk``,
  ``dv`` of ``sum(o * do)``.
  """
  import torch
  import fla.ops.moba.parallel as fla_moba

  (fla_moba.flash_attn_varlen_func, fla_moba._flash_attn_varlen_forward,
   fla_moba._flash_attn_varlen_backward) = _torch_flash_attn()
  rng = np.random.default_rng(SEED)
  lengths = [23, 4, 37, 9]
  t, h, d = sum(lengths), 2, 8
  q, k, v, do = (rng.standard_normal((1, t, h, d)).astype(np.float32)
                 for _ in range(4))
  cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
  out = dict(q=q, k=k, v=v, do=do, cu_seqlens=cu_seqlens)
  for case, block_size, top_k in (("sparse", 4, 3), ("full", 4, 1),
                                  ("all", 8, 9)):
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    o = fla_moba.parallel_moba(tq, tk, tv, torch.tensor(cu_seqlens),
                               max(lengths), block_size, top_k)
    (o * torch.tensor(do)).sum().backward()
    out.update({f"{case}_block_size": np.int32(block_size),
                f"{case}_top_k": np.int32(top_k),
                f"{case}_o": o.detach().numpy(),
                f"{case}_dq": tq.grad.numpy(), f"{case}_dk": tk.grad.numpy(),
                f"{case}_dv": tv.grad.numpy()})
  return out


@fixture("path_attn")
def path_attn():
  """fla's ``naive_path_attn`` (its chunked UT-transform reference) on
  random inputs: T = 37 (not a multiple of its chunk of 16), 4 query heads
  on 2 key/value heads, with a forget gate (``o_gate``) and without one
  (``o``: fla's reference needs a gate, given as zeros), and the gradients
  of the gated output for a random cotangent ``do``."""
  import torch
  from fla.ops.path_attn.naive import naive_path_attn

  rng = np.random.default_rng(SEED)
  b, t, h, hkv, dk, dv, chunk = 2, 37, 4, 2, 8, 8, 16
  w = rng.standard_normal((b, t, hkv, dk))
  arrays = dict(
      q=rng.standard_normal((b, t, h, dk)),
      k=rng.standard_normal((b, t, hkv, dk)),
      v=rng.standard_normal((b, t, hkv, dv)),
      w=w / np.linalg.norm(w, axis=-1, keepdims=True),
      beta=2.0 / (1.0 + np.exp(-rng.standard_normal((b, t, hkv)))),
      g=-np.logaddexp(0.0, -rng.standard_normal((b, t, h))),
      do=rng.standard_normal((b, t, h, dv)))
  arrays = {n: x.astype(np.float32) for n, x in arrays.items()}
  scale = dk ** -0.5
  grads = ("q", "k", "v", "w", "beta", "g")
  inputs = {n: torch.tensor(arrays[n], requires_grad=n in grads)
            for n in ("q", "k", "v", "w", "beta", "g")}
  o_gate = naive_path_attn(**inputs, scale=scale, chunk_size=chunk)
  o_gate.backward(torch.tensor(arrays["do"]))
  with torch.no_grad():
    o = naive_path_attn(**{**inputs, "g": torch.zeros_like(inputs["g"])},
                        scale=scale, chunk_size=chunk)
  arrays.update(o=o.numpy(), o_gate=o_gate.detach().numpy(),
                scale=np.float32(scale))
  arrays.update({f"d{n}": inputs[n].grad.numpy() for n in grads})
  return arrays


def _state_case(case: str, inputs: dict, names: tuple[str, ...],
                initial: bool, run) -> dict:
  """One case of a fixture of a state-carrying op: ``run(tensors, h0)``
  gives ``(o, ht)`` from ``inputs[names]`` as float32 leaf tensors (``h0``
  is None when the case has no initial state); the gradients are those of
  ``sum(o * do) + sum(ht * dht)`` for the stored cotangents. Returns the
  inputs, ``initial``, ``o``, ``ht`` and ``d<name>``, each named
  ``<case>_...``."""
  import torch
  tensors = {n: torch.tensor(inputs[n], requires_grad=True) for n in names}
  o, ht = run(tensors, tensors["h0"] if initial else None)
  ((o * torch.tensor(inputs["do"])).sum()
   + (ht * torch.tensor(inputs["dht"])).sum()).backward()
  arrays = {f"{case}_{n}": x for n, x in inputs.items()}
  arrays[f"{case}_initial"] = np.bool_(initial)
  arrays[f"{case}_o"] = o.detach().numpy()
  arrays[f"{case}_ht"] = ht.detach().numpy()
  arrays.update({f"{case}_d{n}": tensors[n].grad.numpy() for n in names
                 if tensors[n].grad is not None})
  return arrays


# Gated DeltaNet-2: the cases of the fixture, as (name, gate strength, erase
# gate's upper bound, initial state).
GDN2_CASES = (("gentle", 1.0, 1.0, True), ("strong", 20.0, 2.0, False))


@fixture("gdn2")
def gdn2():
  """fla's ``naive_recurrent_gdn2`` (torch, float32) on unit-norm keys,
  ``H = 2``, K != V, T = 19, for each case of ``GDN2_CASES``:
  ``<case>_{q,k,v,g,b,w}`` (``g = log_sigmoid(x) * strength``, ``b`` in
  (0, bound)), ``<case>_h0`` (zeros when the case has no initial state),
  the output ``o``, the final state ``ht`` and the gradients ``d{q,k,v,g,
  b,w,h0}`` of ``sum(o * do) + sum(ht * dht)`` for the stored
  cotangents."""
  from fla.ops.gdn2.naive import naive_recurrent_gdn2

  rng = np.random.default_rng(SEED)
  b, t, h, dk, dv = 2, 19, 2, 8, 6
  sigmoid = lambda x: 1.0 / (1.0 + np.exp(-x))
  arrays = {}
  for case, strength, bound, initial in GDN2_CASES:
    k = rng.standard_normal((b, t, h, dk))
    inputs = {
        "q": rng.standard_normal((b, t, h, dk)),
        "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
        "v": rng.standard_normal((b, t, h, dv)),
        "g": -np.logaddexp(0.0, -rng.standard_normal((b, t, h, dk)))
             * strength,
        "b": bound * sigmoid(rng.standard_normal((b, t, h, dk))),
        "w": sigmoid(rng.standard_normal((b, t, h, dv))),
        "h0": (rng.standard_normal((b, h, dk, dv)) if initial
               else np.zeros((b, h, dk, dv))),
        "do": rng.standard_normal((b, t, h, dv)),
        "dht": rng.standard_normal((b, h, dk, dv)),
    }
    inputs = {n: x.astype(np.float32) for n, x in inputs.items()}
    names = ("q", "k", "v", "g", "b", "w", "h0")
    arrays.update(_state_case(
        case, inputs, names, initial,
        lambda x, h0: naive_recurrent_gdn2(
            *(x[n] for n in names[:-1]), initial_state=h0,
            output_final_state=True)))
  return arrays


@fixture("gated_delta_product")
def gated_delta_product():
  """fla's ``naive_recurrent_gated_delta_product``
  (``fla/ops/gated_delta_product/naive.py``) on two rows of 23 tokens, 3
  Householder steps per token, 2 heads, K = 8 != V = 6, strong-ish gates
  (``log_sigmoid(x) / 0.2``), ``beta`` in (0, 2), unit keys (fla's naive
  form takes normalised keys), a random initial state, the default scale.
  ``gated_*`` has the decay, ``plain_*`` none (``g=None``). Inputs are kept
  in fla's interleaved layout, ``k, v, beta [B, T N, ...]`` (``(t n)``
  order); each case holds ``o`` and the final state ``s``."""
  import torch
  from fla.ops.gated_delta_product.naive import (
      naive_recurrent_gated_delta_product)

  rng = np.random.default_rng(SEED)
  b, t, n, h, dk, dv = 2, 23, 3, 2, 8, 6
  arrays = {}
  for case in ("gated", "plain"):
    k = rng.standard_normal((b, t * n, h, dk))
    x = {"q": rng.standard_normal((b, t, h, dk)),
         "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
         "v": rng.standard_normal((b, t * n, h, dv)),
         "beta": 2 / (1 + np.exp(-rng.standard_normal((b, t * n, h)))),
         "h0": rng.standard_normal((b, h, dk, dv))}
    if case == "gated":
      x["g"] = -np.logaddexp(0.0, -rng.standard_normal((b, t, h))) / 0.2
    x = {name: a.astype(np.float32) for name, a in x.items()}
    o, s = naive_recurrent_gated_delta_product(
        *(torch.from_numpy(x[name]) for name in ("q", "k", "v")),
        None if case == "plain" else torch.from_numpy(x["g"]),
        torch.from_numpy(x["beta"]), scale=dk ** -0.5,
        initial_state=torch.from_numpy(x["h0"]), output_final_state=True,
        num_householder=n)
    x.update(o=o.numpy(), s=s.numpy())
    arrays.update({f"{case}_{name}": a for name, a in x.items()})
  return arrays


def _xlstm_native(inputs, chunk_size=None):
  """transformers' native mLSTM on ``inputs`` (our layout, float32): the
  token-by-token ``mlstm_recurrent_sequence_native`` (or, with
  ``chunk_size``, ``mlstm_chunkwise_native_autograd``) in float64 from the
  stored initial ``(C, n, m)``; ``h``, the final state and the gradients of
  ``sum(h * dh) + sum(C * dC) + sum(n * dn) + sum(m * dm)``."""
  import torch
  from transformers.models.xlstm import modeling_xlstm as xlstm

  def heads_first(x):
    return torch.tensor(np.moveaxis(x, 1, 2), dtype=torch.float64,
                        requires_grad=True)

  q, k, v = (heads_first(inputs[n]) for n in ("q", "k", "v"))
  i, f = (heads_first(inputs[n]) for n in ("i", "f"))
  c0, n0, m0 = (torch.tensor(inputs[n], dtype=torch.float64,
                             requires_grad=True) for n in ("c0", "n0", "m0"))
  if chunk_size is None:
    h, (c, n, m) = xlstm.mlstm_recurrent_sequence_native(
        q, k, v, i, f, c_initial=c0, n_initial=n0, m_initial=m0[..., None],
        return_last_states=True, eps=1e-6, dtype_state=torch.float64)
  else:
    h, (c, n, m) = xlstm.mlstm_chunkwise_native_autograd(
        q, k, v, i, f, c_initial=c0, n_initial=n0, m_initial=m0[..., None],
        return_last_states=True, eps=1e-6, chunk_size=chunk_size)
  h = h.transpose(1, 2)                                       # [B, T, H, V]
  m = m[..., 0]
  loss = sum((x * torch.tensor(inputs[name], dtype=torch.float64)).sum()
             for x, name in ((h, "dh"), (c, "dc"), (n, "dn"), (m, "dm")))
  loss.backward()
  out = {"h": h, "c": c, "n": n, "m": m}
  out.update({"d" + name: x.grad.transpose(1, 2) if x.ndim >= 3 and name in
              ("q", "k", "v", "i", "f") else x.grad
              for name, x in (("q", q), ("k", k), ("v", v), ("i", i),
                              ("f", f), ("c0", c0), ("n0", n0), ("m0", m0))})
  return {name: np.asarray(x.detach().numpy(), np.float32)
          for name, x in out.items()}


@fixture("mlstm")
def mlstm():
  """transformers' native mLSTM of xLSTM-7B (``models/xlstm``, the code
  its inference and training modes run without the ``xlstm`` package),
  in float64 on float32 inputs, K != V, from a random initial ``(C, n,
  m)``: ``<case>_*`` for ``gentle`` (T = 19, gates ``i ~ N(0, 1)``, ``f ~
  N(2, 1)``) and ``strong`` (T = 19, ``i ~ N(0, 8)``, ``f ~ N(0, 10)``),
  token by token, and ``chunkwise`` (T = 32, chunks of 16, gentle gates)
  through its chunkwise form. Each holds the inputs (``q, k, v, i, f`` in
  the layout ``[B, T, H, ...]``, ``c0, n0, m0``), the cotangents ``dh, dc,
  dn, dm``, the outputs ``h, c, n, m`` and the gradients ``d{q, k, v, i,
  f, c0, n0, m0}``."""
  rng = np.random.default_rng(SEED)
  b, h, dk, dv = 2, 2, 8, 6
  arrays = {}
  for case, t, i_scale, f_shift, f_scale, chunk_size in (
      ("gentle", 19, 1.0, 2.0, 1.0, None),
      ("strong", 19, 8.0, 0.0, 10.0, None),
      ("chunkwise", 32, 1.0, 2.0, 1.0, 16)):
    inputs = {"q": rng.standard_normal((b, t, h, dk)),
              "k": rng.standard_normal((b, t, h, dk)),
              "v": rng.standard_normal((b, t, h, dv)),
              "i": i_scale * rng.standard_normal((b, t, h)),
              "f": f_shift + f_scale * rng.standard_normal((b, t, h)),
              "c0": rng.standard_normal((b, h, dk, dv)),
              "n0": rng.standard_normal((b, h, dk)),
              "m0": rng.standard_normal((b, h)),
              "dh": rng.standard_normal((b, t, h, dv)),
              "dc": rng.standard_normal((b, h, dk, dv)),
              "dn": rng.standard_normal((b, h, dk)),
              "dm": rng.standard_normal((b, h))}
    inputs = {n: x.astype(np.float32) for n, x in inputs.items()}
    outputs = _xlstm_native(inputs, chunk_size)
    arrays.update({f"{case}_{n}": x for n, x in {**inputs,
                                                  **outputs}.items()})
  return arrays


# Comba: the cases of the fixture, as (name, gate strength, initial state).
COMBA_CASES = (("gentle", 1.0, True), ("strong", 8.0, False))


@fixture("comba")
def comba():
  """fla's Comba references (torch, float32) on unit-norm keys, ``H = 2``,
  K != V, T = 19, for each case of ``COMBA_CASES``: ``<case>_{q,k,v,p,g,
  beta}`` (``g = log_sigmoid(x) * strength``, ``p = sigmoid(d) k`` plus a
  little noise), ``<case>_h0`` (zeros when the case has no initial state).
  ``naive_chunk_comba`` (chunks of 8: the recurrence of fla's kernels,
  which read the state before the decay) gives the output ``o``, the final
  state ``ht`` and the gradients ``d{q,k,v,p,g,beta,h0}`` of ``sum(o * do)
  + sum(ht * dht)`` for the stored cotangents; ``naive_recurrent_comba``
  (which reads the decayed state) gives ``o_decayed_read`` and
  ``ht_decayed_read``."""
  import torch
  from fla.ops.comba.naive import naive_chunk_comba, naive_recurrent_comba

  rng = np.random.default_rng(SEED)
  b, t, h, dk, dv = 2, 19, 2, 8, 6
  sigmoid = lambda x: 1.0 / (1.0 + np.exp(-x))
  arrays = {}
  for case, strength, initial in COMBA_CASES:
    k = rng.standard_normal((b, t, h, dk))
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    inputs = {
        "q": rng.standard_normal((b, t, h, dk)),
        "k": k,
        "v": rng.standard_normal((b, t, h, dv)),
        "p": (sigmoid(rng.standard_normal((h, 1))) * k
              + 0.1 * rng.standard_normal((b, t, h, dk))),
        "g": -np.logaddexp(0.0, -rng.standard_normal((b, t, h))) * strength,
        "beta": sigmoid(rng.standard_normal((b, t, h))),
        "h0": (rng.standard_normal((b, h, dk, dv)) if initial
               else np.zeros((b, h, dk, dv))),
        "do": rng.standard_normal((b, t, h, dv)),
        "dht": rng.standard_normal((b, h, dk, dv)),
    }
    inputs = {n: x.astype(np.float32) for n, x in inputs.items()}
    names = ("q", "k", "v", "p", "g", "beta", "h0")
    arrays.update(_state_case(
        case, inputs, names, initial,
        lambda x, h0: naive_chunk_comba(
            *(x[n] for n in names[:-1]), chunk_size=8, initial_state=h0,
            output_final_state=True)))
    with torch.no_grad():
      o_read, ht_read = naive_recurrent_comba(
          *(torch.tensor(inputs[n]) for n in ("q", "k", "v", "p", "beta",
                                              "g")),
          initial_state=torch.tensor(inputs["h0"]) if initial else None,
          output_final_state=True)
    arrays[f"{case}_o_decayed_read"] = o_read.numpy()
    arrays[f"{case}_ht_decayed_read"] = ht_read.numpy()
  return arrays


MAMBA3_INPUTS = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias",
                 "Angles", "angle0", "ssm0", "k0", "v0")


@fixture("mamba3")
def mamba3():
  """The reference's ``mamba3_siso_step_ref`` (state-spaces/mamba, see
  ``experiments/mamba3_reference.py``) in float64 on float32 inputs, K = N
  = 8 != V = P = 6, A = 2 rotated pairs (``rope_fraction = 0.5``), T = 23, from a
  random state ``(angle0, ssm0, k0, v0)``: ``<case>_*`` for ``gentle``
  (``dt ~ softplus(N(-1, 1))``, ``ADT = -exp(N(0, 0.5)) dt``, ``Trap,
  Angles ~ N(0, 1)``) and ``strong`` (``ADT`` uniform in (-20, 0), ``Trap
  ~ N(0, 4)``, ``Angles ~ N(0, 3)``). Each holds the inputs in the
  reference's layouts, the cotangent ``dout``, the outputs ``out``,
  ``angle, ssm, k, v`` (final states) and the gradients of ``sum(out *
  dout)`` for every input but the state."""
  import torch

  from experiments.mamba3_reference import mamba3_siso_step_ref

  rng = np.random.default_rng(SEED)
  b, t, h, n, p, a = 2, 23, 2, 8, 6, 2
  arrays = {}
  for case, strong in (("gentle", False), ("strong", True)):
    dt = np.log1p(np.exp(rng.standard_normal((b, h, t)) - 1.0))
    adt = (-rng.uniform(0.0, 20.0, (b, h, t)) if strong
           else -np.exp(0.5 * rng.standard_normal((b, h, t))) * dt)
    inputs = {"Q": rng.standard_normal((b, t, h, n)),
              "K": rng.standard_normal((b, t, h, n)),
              "V": rng.standard_normal((b, t, h, p)),
              "ADT": adt, "DT": dt,
              "Trap": (4.0 if strong else 1.0)
                      * rng.standard_normal((b, h, t)),
              "Q_bias": rng.standard_normal((h, n)),
              "K_bias": rng.standard_normal((h, n)),
              "Angles": (3.0 if strong else 1.0)
                        * rng.standard_normal((b, t, h, a)),
              "angle0": rng.uniform(0.0, 2 * np.pi, (b, h, a)),
              "ssm0": rng.standard_normal((b, h, p, n)),
              "k0": rng.standard_normal((b, h, n)),
              "v0": rng.standard_normal((b, h, p)),
              "dout": rng.standard_normal((b, t, h, p))}
    inputs = {name: x.astype(np.float32) for name, x in inputs.items()}
    x = {name: torch.tensor(inputs[name], dtype=torch.float64,
                            requires_grad=name in MAMBA3_INPUTS[:9])
         for name in MAMBA3_INPUTS}
    out, states = mamba3_siso_step_ref(
        *(x[name] for name in MAMBA3_INPUTS[:9]),
        tuple(x[name] for name in MAMBA3_INPUTS[9:]))
    (out * torch.tensor(inputs["dout"], dtype=torch.float64)).sum().backward()
    outputs = {"out": out, **dict(zip(("angle", "ssm", "k", "v"), states)),
               **{"d" + name: x[name].grad for name in MAMBA3_INPUTS[:9]}}
    outputs = {name: y.detach().numpy().astype(np.float32)
               for name, y in outputs.items()}
    arrays.update({f"{case}_{name}": y for name, y in {**inputs,
                                                       **outputs}.items()})
  return arrays


MAMBA3_MIMO_INPUTS = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias",
                      "Angles", "MIMO_V", "MIMO_O", "D", "Z", "MIMO_Z",
                      "angle0", "ssm0", "k0", "v0")


@fixture("mamba3_mimo")
def mamba3_mimo():
  """The reference's ``mamba3_MIMO_step_ref`` (state-spaces/mamba, see
  ``experiments/mamba3_reference.py``; its pairwise rotation) in float64
  on float32 inputs, R = 3 ranks, K = N = 8 != V = P = 6, A = 2 rotated
  pairs, T = 23, with ``D``, the gate ``Z`` and the rank projections
  ``MIMO_V``, ``MIMO_Z``, ``MIMO_O``, from a random state ``(angle0,
  ssm0, k0, v0)``: ``<case>_*`` for ``gentle`` and ``strong`` (the gates
  as in ``mamba3``). Each holds the inputs in the reference's layouts, the
  cotangent ``dout``, the outputs ``out``, ``angle, ssm, k, v`` (final
  states) and the gradients of ``sum(out * dout)`` for every input but
  the state."""
  import torch

  from experiments.mamba3_reference import mamba3_mimo_step_ref

  rng = np.random.default_rng(SEED)
  b, t, r, h, n, p, a = 2, 23, 3, 2, 8, 6, 2
  diff = MAMBA3_MIMO_INPUTS[:14]
  arrays = {}
  for case, strong in (("gentle", False), ("strong", True)):
    dt = np.log1p(np.exp(rng.standard_normal((b, h, t)) - 1.0))
    adt = (-rng.uniform(0.0, 20.0, (b, h, t)) if strong
           else -np.exp(0.5 * rng.standard_normal((b, h, t))) * dt)
    inputs = {"Q": rng.standard_normal((b, t, r, h, n)),
              "K": rng.standard_normal((b, t, r, h, n)),
              "V": rng.standard_normal((b, t, h, p)),
              "ADT": adt, "DT": dt,
              "Trap": (4.0 if strong else 1.0)
                      * rng.standard_normal((b, h, t)),
              "Q_bias": rng.standard_normal((h, r, n)),
              "K_bias": rng.standard_normal((h, r, n)),
              "Angles": (3.0 if strong else 1.0)
                        * rng.standard_normal((b, t, h, a)),
              "MIMO_V": rng.standard_normal((h, r, p)) / r,
              "MIMO_O": rng.standard_normal((h, r, p)) / r,
              "D": rng.standard_normal((h,)),
              "Z": rng.standard_normal((b, t, h, p)),
              "MIMO_Z": rng.standard_normal((h, r, p)),
              "angle0": rng.uniform(0.0, 2 * np.pi, (b, h, a)),
              "ssm0": rng.standard_normal((b, h, p, n)),
              "k0": rng.standard_normal((b, h, r, n)),
              "v0": rng.standard_normal((b, h, r, p)),
              "dout": rng.standard_normal((b, t, h, p))}
    inputs = {name: x.astype(np.float32) for name, x in inputs.items()}
    x = {name: torch.tensor(inputs[name], dtype=torch.float64,
                            requires_grad=name in diff)
         for name in MAMBA3_MIMO_INPUTS}
    out, states = mamba3_mimo_step_ref(
        *(x[name] for name in diff),
        Input_States=tuple(x[name] for name in MAMBA3_MIMO_INPUTS[14:]))
    (out * torch.tensor(inputs["dout"], dtype=torch.float64)).sum().backward()
    outputs = {"out": out, **dict(zip(("angle", "ssm", "k", "v"), states)),
               **{"d" + name: x[name].grad for name in diff}}
    outputs = {name: y.detach().numpy().astype(np.float32)
               for name, y in outputs.items()}
    arrays.update({f"{case}_{name}": y for name, y in {**inputs,
                                                       **outputs}.items()})
  return arrays


@fixture("log_linear_attn")
def log_linear_attn():
  """fla's ``naive_log_linear_attn`` (``fla/ops/log_linear_attn/naive.py``:
  the segsum and the level masks) in float64 on float32 inputs, 2 heads, K
  = 8 != V = 6, scale ``K ** -0.5``: ``gentle_*`` (T = 37, gates
  ``log_sigmoid(x + 2)``, ``L = 8`` levels, one more than the 7 fla reads)
  and ``strong_*`` (T = 64, ``log_sigmoid(x) / 0.05``, ``L = 7``), with
  ``level_scales`` in (0, 2). Each holds ``q, k, v, g, level_scales``, the
  cotangent ``do``, the output ``o`` and the gradients ``d{q, k, v, g,
  level_scales}`` of ``sum(o * do)``."""
  import torch
  from fla.ops.log_linear_attn.naive import naive_log_linear_attn

  rng = np.random.default_rng(SEED)
  b, h, dk, dv = 2, 2, 8, 6
  arrays = {}
  for case, t, levels, strong in (("gentle", 37, 8, False),
                                  ("strong", 64, 7, True)):
    x = rng.standard_normal((b, t, h))
    g = (-np.logaddexp(0.0, -x) / 0.05 if strong
         else -np.logaddexp(0.0, -(x + 2.0)))
    inputs = {"q": rng.standard_normal((b, t, h, dk)),
              "k": rng.standard_normal((b, t, h, dk)),
              "v": rng.standard_normal((b, t, h, dv)), "g": g,
              "level_scales": 2 * rng.random((b, t, h, levels)),
              "do": rng.standard_normal((b, t, h, dv))}
    inputs = {n: a.astype(np.float32) for n, a in inputs.items()}
    leaves = {n: torch.tensor(inputs[n], dtype=torch.float64,
                              requires_grad=True)
              for n in ("q", "k", "v", "g", "level_scales")}
    o = naive_log_linear_attn(*leaves.values(), scale=dk ** -0.5)
    (o * torch.tensor(inputs["do"], dtype=torch.float64)).sum().backward()
    outputs = {"o": o, **{"d" + n: x.grad for n, x in leaves.items()}}
    outputs = {n: np.asarray(x.detach().numpy(), np.float32)
               for n, x in outputs.items()}
    arrays.update({f"{case}_{n}": a for n, a in {**inputs,
                                                  **outputs}.items()})
  return arrays
def _mesa_net_inputs(rng, b, t, h, d, q_scale):
  """Unit keys and queries (times ``q_scale``), gentle log-decays, ``beta``
  in (0, 1), ``lamb = softplus(N(0, 1)) + 0.25`` and a reachable initial
  ``H^kk`` (``sum_j beta_j k_j k_j^T`` over 16 unit keys), as float32."""
  def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)

  prior = unit(rng.standard_normal((b, 16, h, d)))
  weights = 1 / (1 + np.exp(-rng.standard_normal((b, 16, h))))
  x = {"q": q_scale * unit(rng.standard_normal((b, t, h, d))),
       "k": unit(rng.standard_normal((b, t, h, d))),
       "v": rng.standard_normal((b, t, h, d)),
       "g": -np.logaddexp(0.0, -(rng.standard_normal((b, t, h)) + 2.0)),
       "beta": 1 / (1 + np.exp(-rng.standard_normal((b, t, h)))),
       "lamb": np.logaddexp(0.0, rng.standard_normal((h, d))) + 0.25,
       "h_kk0": np.einsum("bjhk,bjh,bjhl->bhkl", prior, weights, prior),
       "h_kv0": rng.standard_normal((b, h, d, d))}
  return {name: a.astype(np.float32) for name, a in x.items()}


@fixture("mesa_net")
def mesa_net():
  """fla's MesaNet references (``fla/ops/mesa_net/naive.py``, which needs
  K = V and computes in float32) on two rows, 2 heads, K = V = 8:

  - ``cg_*``: ``naive_mesa_net_CG`` (30 CG steps from 0, chunks of 8) on
    T = 32 unit queries: ``o``, final ``h_kk``, ``h_kv``.
  - ``decoding_*``: ``naive_mesa_net_decoding_one_step`` token by token
    (30 steps from the start ``q / (diag(H^kk) + lamb)``) on the same
    inputs: ``o``, final ``h_kk``, ``h_kv``.
  - ``exact_*``: ``naive_mesa_net_exact`` (``torch.linalg.solve``) on T =
    19 queries of norm 1e3, and the gradients ``d{q, k, v, g, beta, lamb,
    h_kk0, h_kv0}`` of ``sum(o do) + sum(h_kk dh_kk) + sum(h_kv dh_kv)``
    (``do`` of RMS 1e3): CG's ``1e-5`` guards stop it near a residual of
    ``sqrt(1e-5 / lamb)``, a relative 3e-6 at that scale, so a CG solve
    and its implicit gradient are compared with the exact ones there.
  """
  import torch
  from fla.ops.mesa_net.naive import (naive_mesa_net_CG,
                                      naive_mesa_net_decoding_one_step,
                                      naive_mesa_net_exact)

  rng = np.random.default_rng(SEED)
  b, h, d = 2, 2, 8
  arrays = {}
  x = _mesa_net_inputs(rng, b, 32, h, d, 1.0)
  ref = {n: torch.from_numpy(a) for n, a in x.items()}
  args = [ref[n] for n in ("q", "k", "v", "g", "lamb", "beta")]
  o, h_kk, h_kv = naive_mesa_net_CG(*args, chunk_size=8,
                                    max_CG_iteration=30,
                                    h_kk_init=ref["h_kk0"],
                                    h_kv_init=ref["h_kv0"])
  arrays.update({f"cg_{n}": a for n, a in x.items()})
  arrays.update(cg_o=o, cg_h_kk=h_kk, cg_h_kv=h_kv)
  h_kk, h_kv, outs = ref["h_kk0"], ref["h_kv0"], []
  for step in range(x["q"].shape[1]):
    o_t, h_kk, h_kv = naive_mesa_net_decoding_one_step(
        *(a[:, step] for a in args[:4]), args[4], args[5][:, step], h_kk,
        h_kv, max_CG_iteration=30)
    outs.append(o_t)
  arrays.update(decoding_o=torch.stack(outs, 1), decoding_h_kk=h_kk,
                decoding_h_kv=h_kv)

  x = _mesa_net_inputs(rng, b, 19, h, d, 1e3)
  x.update(do=1e3 * rng.standard_normal((b, 19, h, d)),
           dh_kk=rng.standard_normal((b, h, d, d)),
           dh_kv=rng.standard_normal((b, h, d, d)))
  x = {n: a.astype(np.float32) for n, a in x.items()}
  ref = {n: torch.tensor(a, requires_grad=True) for n, a in x.items()}
  o, h_kk, h_kv = naive_mesa_net_exact(
      *(ref[n] for n in ("q", "k", "v", "g", "lamb", "beta")),
      h_kk_init=ref["h_kk0"], h_kv_init=ref["h_kv0"])
  loss = ((o * ref["do"]).sum() + (h_kk * ref["dh_kk"]).sum()
          + (h_kv * ref["dh_kv"]).sum())
  loss.backward()
  arrays.update({f"exact_{n}": a for n, a in x.items()})
  arrays.update(exact_o=o, exact_h_kk=h_kk, exact_h_kv=h_kv)
  arrays.update({f"exact_d{n}": ref[n].grad for n in
                 ("q", "k", "v", "g", "beta", "lamb", "h_kk0", "h_kv0")})
  return {n: np.asarray(a.detach().numpy() if hasattr(a, "detach") else a,
                        np.float32) for n, a in arrays.items()}


def main(argv):
  del argv
  names = FLAGS.only or sorted(FIXTURES)
  os.makedirs(FLAGS.out, exist_ok=True)
  for name in names:
    arrays = FIXTURES[name]()
    path = os.path.join(FLAGS.out, f"{name}.npz")
    np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})
    print(f"wrote {path}: {', '.join(sorted(arrays))}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
