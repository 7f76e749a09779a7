"""flash-linear-attention's naive native sparse attention, runnable on CPU.

fla's ``naive_nsa`` (``fla.ops.nsa.naive``) is torch except for two calls:
the Triton mean pooling of the blocks and flash-attn's sliding window. Here
both become plain torch (the pooling: blocks of each sequence, the last one
the mean of the tokens it has; the window: causal, the query and the
``window_size - 1`` keys before it, within each sequence), for the fixture
makers (``make_op_fixtures``, ``make_hf_fixtures``). Needs the ``hf``
extra.
"""

from __future__ import annotations


def naive_nsa_on_cpu():
  """fla's ``naive_nsa`` with its non-torch calls swapped for torch."""
  import torch
  import fla.ops.nsa.naive as naive

  def mean_pooling(x, chunk_size, cu_seqlens=None, **kwargs):
    del kwargs
    bounds = ([(0, x.shape[1])] if cu_seqlens is None
              else list(zip(cu_seqlens[:-1].tolist(),
                            cu_seqlens[1:].tolist())))
    pooled = [torch.stack([x[:, i:min(i + chunk_size, end)].mean(1)
                           for i in range(start, end, chunk_size)], 1)
              for start, end in bounds]
    return torch.cat(pooled, 1)

  def window(q, k, v, window_size, cu_seqlens=None):
    g = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(g, dim=2) for x in (k, v))
    t = q.shape[1]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (j <= i) & (i - j <= window_size[0])
    if cu_seqlens is not None:
      doc = torch.bucketize(torch.arange(t), cu_seqlens[1:], right=True)
      allowed &= doc[:, None] == doc[None, :]
    s = torch.einsum("bihd,bjhd->bhij", q.float(), k.float())
    s = s * q.shape[-1] ** -0.5
    p = s.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("bhij,bjhd->bihd", p, v.float()).to(q.dtype)

  def flash_attn_func(q, k, v, causal, window_size):
    assert causal
    return window(q, k, v, window_size)

  def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, causal, window_size):
    del cu_seqlens_k, max_seqlen_q, max_seqlen_k
    assert causal
    return window(q[None], k[None], v[None], window_size, cu_seqlens_q)[0]

  naive.mean_pooling = mean_pooling
  naive.flash_attn_func = flash_attn_func
  naive.flash_attn_varlen_func = flash_attn_varlen_func
  return naive.naive_nsa


def parallel_nsa_on_cpu():
  """A stand-in for fla's ``parallel_nsa`` (which its NSA layer calls)
  built on ``naive_nsa_on_cpu``: queries may be the last ``TQ`` of the
  ``TK`` keys (decoding with a cache), as the Triton kernels allow; they
  are padded in front to ``TK`` with zero queries and gates, and only the
  last ``TQ`` outputs are kept (every query's output depends on its own
  inputs and the keys alone)."""
  import torch
  naive_nsa = naive_nsa_on_cpu()

  def parallel_nsa(q, k, v, g_cmp=None, g_slc=None, g_swa=None,
                   block_indices=None, block_counts=16, block_size=64,
                   window_size=0, scale=None, cu_seqlens=None):
    assert block_indices is None
    tq, tk = q.shape[1], k.shape[1]

    def pad(x):
      if x is None or tq == tk:
        return x
      return torch.cat([x.new_zeros((x.shape[0], tk - tq) + x.shape[2:]), x],
                       dim=1)

    o = naive_nsa(pad(q), k, v, pad(g_cmp), pad(g_slc), pad(g_swa),
                  block_counts=block_counts, block_size=block_size,
                  window_size=window_size, scale=scale, cu_seqlens=cu_seqlens)
    return o[:, tk - tq:]

  return parallel_nsa
