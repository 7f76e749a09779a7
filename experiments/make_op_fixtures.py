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
  app.run(main)
