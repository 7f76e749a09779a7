"""Chunkwise form: exact pairs inside a chunk, states passed between chunks.

The sequence is cut into chunks of ``C`` tokens. Writing ``P_ij =
exp(sum_{j<m<=i} g_m)`` for the decay from token j to token i:

1. Log-decay sums over a chunk, from its start to each token and from each
   token to its end, summed in sub-chunks of ``c`` tokens (``sub_chunk_size``)
   and then over sub-chunks: no long prefix sum is subtracted from another,
   and every ``exp`` below is of a sum of gates, so a decay ``<= 1``: strong
   gates underflow to 0 where the true value is negligible and never
   overflow.
2. Chunk states: each chunk's own contribution ``sum_j exp(G_end - G_j) k_j
   v_j^T`` and total decay, then a ``lax.scan`` over chunks for the state
   entering each chunk. Each output reads the state entering its chunk,
   ``(q_i exp(G_i)) . S``.
3. Pairs inside a chunk, exactly, by halving: a block's pairs with ``j`` in
   its left half and ``i`` in its right half factor through the middle,
   ``P_ij = exp(sum_{mid<m<=i} g_m) exp(sum_{j<m<=mid} g_m)``, two decays
   ``<= 1`` that scale ``q_i`` and ``k_j``; the pairs are then one ``[C/2,
   C/2]`` matmul per block. The pairs inside each half are the same problem
   at half the size, down to single tokens: ``log2(C)`` levels, all matmuls,
   no ``[C, C, K]`` tensor, and each gate enters a pair's decay once (no
   equal and opposite terms for its gradient to cancel). The diagonal
   ``i = j`` has decay 1. With a scalar decay per head (or none) this step
   and the state read are instead one ``[C, C]`` decay matrix per head
   (``scalar_decay.py``).

With ``strictly_causal=True`` (RWKV-6) the output at i reads the state
before token i: the decays that scale ``q_i`` stop at ``i - 1`` and the
diagonal is dropped, so a pair decays over ``j < m < i``.

Segment ids enter as masks: a pair counts only inside one document, an
entering state reaches ``i`` only if no document started before ``i`` in the
chunk, and a token reaches an end state only if it is in the last document.

Step 3 and the state read run over groups of chunks (``lax.map``,
rematerialised in the backward pass): only the chunk states ``[B, N, H, K,
V]`` are stored between the passes.

Letters: b batch, n chunk, p block, i and j position in a block (or chunk),
h head, k key channel, v value channel, g gate width (1 for a scalar decay
per head, K for a decay per key channel).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import (checks, context_parallel, dispatch,
                                    kernel_sharding)
from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.chunking import (chunk_layout, chunks_per_group,
                                             map_chunk_groups, merge_chunks,
                                             pad_time, split_chunks)
from lin_attn_jax.ops.common.chunk_scores import (dot_last, halves,
                                                  level_log_decays,
                                                  power_of_two)
from lin_attn_jax.ops.common.decay import chunk_log_decays, shift
from lin_attn_jax.ops.common.segments import chunk_documents
from lin_attn_jax.ops.gated_linear import context_parallel as split
from lin_attn_jax.ops.gated_linear.bidirectional import (gate_as_given,
                                                   lion_outputs)
from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate
from lin_attn_jax.ops.gated_linear.scalar_decay import scalar_decay_outputs
from pallas_kernels.gated_linear import chunk_gated_linear_attention

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


# Rows scaled by a vector are written as dot_general: XLA:CPU runs them
# several times faster than a multiply followed by a reduction (which is
# what autodiff of a broadcast multiply produces).

def _scale_rows(d, s):
  """``d[..., None] * s``: ``d [..., K]`` (or ``[..., 1]``) scales the rows
  of ``s [..., K, V]``."""
  if d.shape[-1] != s.shape[-2]:
    return d[..., None] * s
  return jnp.einsum("...k,...kv->...kv", d, s, preferred_element_type=_F32)


def _chunk_states(q_c, k_c, v_c, g_c, doc_c, doc_before, *, sub):
  """Step 2: each chunk's own end state and its total decay.

  Args:
    q_c, k_c: ``[B, N, C, H, K]``; v_c: ``[B, N, C, H, V]``;
    g_c: ``[B, N, C, H, G]``; doc_c: ``[B, N, C]`` document index;
    doc_before: ``[B, N]`` document of the token before each chunk.
  Returns:
    ``own [B, N, H, K, V]`` (the chunk's tokens decayed to its end, last
    document only) and ``decay [B, N, H, G]`` (0 where a document starts
    inside the chunk, so the entering state does not pass).
  """
  del q_c
  _, to_end, total = chunk_log_decays(g_c, sub, axis=2)
  doc_last = doc_c[:, :, -1]                                    # [B, N]
  in_last_doc = (doc_c == doc_last[..., None])[..., None, None]
  k_to_end = jnp.where(in_last_doc, k_c * jnp.exp(to_end), 0.0)  # [B,N,C,H,K]
  own = _mm("bnjhk,bnjhv->bnhkv", k_to_end, v_c)                # [B,N,H,K,V]
  passes = (doc_last == doc_before)[..., None, None]            # [B, N, 1, 1]
  return own, jnp.where(passes, jnp.exp(total), 0.0)


def _pairs_in_chunk(q_c, k_c, v_c, g_c, doc_c, strict):
  """Step 3: the part of each output from its own chunk, exactly.

  q_c, k_c: ``[B, N, C, H, K]`` (q scaled); v_c: ``[B, N, C, H, V]``;
  g_c: ``[B, N, C, H, G]``; doc_c: ``[B, N, C]`` or None (one document);
  strict: i reads the state before its token (no diagonal, and a pair
  decays over ``j < m < i``). Returns ``[B, N, C, H, V]`` float32.

  A chunk whose length is not a power of two is padded with tokens that
  neither write (``k = 0``) nor decay (``g = 0``).
  """
  c = q_c.shape[2]
  size = power_of_two(c)
  if size != c:
    q_c, k_c, v_c, g_c = (pad_time(x, size, axis=2)
                          for x in (q_c, k_c, v_c, g_c))
    if doc_c is not None:
      doc_c = pad_time(doc_c, size, axis=2, mode="edge")
  o = (jnp.zeros(v_c.shape, _F32) if strict
       else dot_last(q_c, k_c)[..., None] * v_c)                # i = j
  levels, _ = level_log_decays(g_c, axis=2, strict=strict)
  for half in sorted(levels, reverse=True):
    (_, q_right), (k_left, _), (v_left, _) = (
        halves(x, half, axis=2) for x in (q_c, k_c, v_c))
    to_i, from_j = levels[half]
    q_read = q_right * jnp.exp(to_i)                            # [B,N,P,i,H,K]
    k_write = k_left * jnp.exp(from_j)                          # [B,N,P,j,H,K]
    scores = _mm("bnpihk,bnpjhk->bnphij", q_read, k_write)
    if doc_c is not None:
      doc_left, doc_right = halves(doc_c, half, axis=2)                # [B,N,P,half]
      same = doc_right[..., :, None] == doc_left[..., None, :]
      scores = jnp.where(same[:, :, :, None], scores, 0.0)
    o_right = _mm("bnphij,bnpjhv->bnpihv", scores, v_left)
    o = o + jnp.stack([jnp.zeros_like(o_right), o_right], axis=3).reshape(
        o.shape)
  return o[:, :, :c]


def _chunk_outputs(q_c, k_c, v_c, g_c, doc_c, doc_before, entering, *, sub,
                   packed, strict=False):
  """Steps 2 (the read) and 3: outputs of every chunk given its entering state.

  Shapes as in ``_chunk_states``; ``entering: [B, N, H, K, V]``; ``packed``
  says whether there are several documents; ``strict``: outputs read the
  state before their token. Returns ``o [B, N, C, H, V]`` float32.
  """
  o = _pairs_in_chunk(q_c, k_c, v_c, g_c, doc_c if packed else None, strict)
  to_here, _, _ = chunk_log_decays(g_c, sub, axis=2)
  if strict:
    to_here = shift(to_here, 1, axis=2)                        # to i - 1
  reached = (doc_c == doc_before[..., None])[..., None, None]   # [B,N,C,1,1]
  q_read = jnp.where(reached, q_c * jnp.exp(to_here), 0.0)      # [B,N,C,H,K]
  return o + _mm("bnihk,bnhkv->bnihv", q_read, entering)


@context_parallel.splits_sequence(
    lambda: split.context_parallel_gated_linear)
def chunk_gated_linear(q, k, v, g=None, *, scale=None, initial_state=None,
                       output_final_state=False, segment_ids=None,
                       chunk_size=64, sub_chunk_size=8, impl="auto",
                       strictly_causal=False, causal=True):
  """Gated linear attention, chunkwise; the training path on every backend.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: natural-log decay ``<= 0``, ``[B, T, H]`` (scalar per head) or
      ``[B, T, H, K]`` (per key channel), or None (no decay).
    scale: query scale, ``K ** -0.5`` when None.
    initial_state: ``[B, H, K, V]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk ``C`` (speed only, not results). The
      Pallas kernels take it too (``pallas_kernels.gated_linear.BlockSizes
      .default``): on TPU rounded up to whole 128-token tiles, at most 256;
      on GPU rounded up to a power of two, capped by dtype and gate.
    sub_chunk_size: tokens per sub-chunk ``c`` of the log-decay sums (step
      1) of the XLA form; must divide ``chunk_size``. The kernels keep
      their own tiles (on TPU, row blocks of 16 tokens for a decay per key
      channel).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"`` (see
      ``lin_attn_jax.ops.common.dispatch``): the Pallas kernel (``"auto"``:
      where a committed measurement on the platform backs it, on GPU; on
      TPU this chunk form until a TPU has run the kernels), or this chunk
      form in XLA. Under a mesh set with ``jax.set_mesh``
      the kernel runs per shard of the batch and heads
      (``lin_attn_jax.ops.common.kernel_sharding``).
    strictly_causal: ``o_t = S_{t-1}^T q_t``, the state before token t
      (RWKV-6), instead of ``S_t^T q_t``; the final state is the same. XLA
      only (``impl="pallas"`` raises).
    causal: False for the non-causal form (LION, ``bidirectional.py``):
      every token reads its whole document, ``o_i = sum_j M_ij (scale q_i
      . k_j) v_j`` with ``M_ij`` the decays between i and j in either
      direction; this form forward, then on the reversed sequence with the
      gates one token earlier, minus the diagonal. No state: then
      ``initial_state`` must be None and ``output_final_state`` False.
  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state [B, H, K, V] float32 or
    None)``.

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2, 16), -0.1)
    >>> o, s = chunk_gated_linear(q, k, v, g, output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 2, 32), (1, 2, 16, 32))
  """
  b, t, h, dk, dv, g = validate(q, k, v, g, initial_state, segment_ids)
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  dispatch.check_impl(impl)
  scale = default_scale(scale, dk)
  check_no_state("chunk_gated_linear", causal, initial_state,
                 output_final_state)
  if not causal:
    if strictly_causal:
      raise ValueError("strictly_causal=True has no non-causal form")
    form = functools.partial(chunk_gated_linear, chunk_size=chunk_size,
                             sub_chunk_size=sub_chunk_size, impl=impl)
    return lion_outputs(form, q, k, v, gate_as_given(g), scale=scale,
                        segment_ids=segment_ids).astype(v.dtype), None
  xla = functools.partial(
      _chunk_xla, q, k, v, g, scale=scale, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      chunk_size=chunk_size, sub_chunk_size=sub_chunk_size,
      strictly_causal=strictly_causal)
  if strictly_causal:
    if impl == "pallas":
      raise ValueError("strictly_causal=True has no Pallas kernel; use "
                       "impl='auto' or 'xla'")
    return xla()
  def pallas():
    return kernel_sharding.per_shard(
        functools.partial(chunk_gated_linear_attention, scale=scale,
                          output_final_state=output_final_state,
                          chunk_size=chunk_size),
        dict(q=q, k=k, v=v, g=g, initial_state=initial_state,
             segment_ids=segment_ids),
        dict(q="bthk", k="bthk", v="bthv", g="bthg",
             initial_state="bhkv", segment_ids="bt"),
        ("bthv", "bhkv" if output_final_state else None), batch=b, heads=h)

  return dispatch.run(impl, xla, pallas, family="gated_linear")


def _chunk_xla(q, k, v, g, *, scale, initial_state, output_final_state,
               segment_ids, chunk_size, sub_chunk_size, strictly_causal):
  """The chunk form in XLA; ``g`` validated (``[B, T, H, G]`` or None)."""
  b, t, h, dk = q.shape
  dv = v.shape[-1]
  chunk, c = chunk_layout(t, chunk_size, sub_chunk_size)
  if g is None:
    g = jnp.zeros((b, t, h, 1), _F32)
  out_dtype = v.dtype
  q, k, g, v = (pad_time(jnp.asarray(x, _F32), chunk) for x in (q, k, g, v))
  # One document (all indices 0) without segment ids.
  doc_c, doc_before = chunk_documents(
      jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids,
      b, t, chunk)                                              # [B,N,C], [B,N]
  per_chunk = (split_chunks(scale * q, chunk), split_chunks(k, chunk),
               split_chunks(v, chunk), split_chunks(g, chunk), doc_c,
               doc_before)
  group = chunks_per_group(chunk)

  # Only ``[C, K]`` factors per chunk: no grouping needed.
  own_state, chunk_decay = _chunk_states(*per_chunk, sub=c)

  def carry_state(state, inputs):
    decay, own = inputs                                         # [B,H,G], [B,H,K,V]
    return _scale_rows(decay, state) + own, state

  state0 = (jnp.zeros((b, h, dk, dv), _F32) if initial_state is None
            else jnp.asarray(initial_state, _F32))
  final_state, entering = jax.lax.scan(
      carry_state, state0,
      (jnp.moveaxis(chunk_decay, 1, 0), jnp.moveaxis(own_state, 1, 0)))
  entering = jnp.moveaxis(entering, 0, 1)                       # [B,N,H,K,V]

  packed = segment_ids is not None
  if g.shape[-1] == 1 and not strictly_causal:
    # A scalar decay per head needs no secondary chunking and no grouping:
    # one [C, C] decay matrix per head, T * C * H numbers in all.
    o = scalar_decay_outputs(*per_chunk, entering, packed=packed)
  else:
    o = map_chunk_groups(
        functools.partial(_chunk_outputs, sub=c, packed=packed,
                          strict=strictly_causal),
        per_chunk + (entering,), group)
  o = merge_chunks(o)[:, :t]
  return o.astype(out_dtype), (final_state if output_final_state else None)
