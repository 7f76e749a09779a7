"""Chunkwise form: exact scores inside a chunk, states passed between chunks.

The sequence is cut into chunks of ``C`` tokens, each chunk into sub-chunks
of ``c`` tokens (secondary chunking). Letting ``G_i`` be the cumulative
log-decay and ``L_i`` its part since the start of i's sub-chunk:

1. Log-decays local to each sub-chunk: ``L`` (sub-chunk start to i), the
   reverse sums (j to sub-chunk end), sub-chunk totals, and their sums over
   whole sub-chunks. No long prefix sum is subtracted from another, and
   every ``exp`` below is of a sum of gates, so a decay ``<= 1``: strong
   gates underflow to 0 where the true value is negligible and never
   overflow.
2. Chunk states: each chunk's own contribution ``sum_j exp(G_end - G_j) k_j
   v_j^T`` and total decay, then a ``lax.scan`` over chunks for the state
   entering each chunk.
3. Inside a chunk, sub-chunk by sub-chunk (vectorised over all chunks):
   the output reads the state entering the sub-chunk, ``(q_i exp(L_i)) .
   S``, and the state moves on by ``exp(total) S + sum_j (k_j exp(L_end -
   L_j)) v_j^T``: matmuls only.
4. Within one sub-chunk, exactly, offset by offset ``d = i - j``:
   ``o_i += (sum_k q_ik k_jk exp(sum_{j<m<=i} g_mk)) v_j`` with the decay
   carried as a running product of ``exp(g) <= 1``; the diagonal ``d = 0``
   has decay 1 and no gate (so no equal-and-opposite gradients cancel
   there). Memory and work are ``O(c)`` passes over ``[T, H, K]``; no
   ``[c, c, K]`` tensor is formed.
   With a scalar decay per head (or none), steps 3 and 4 are instead one
   ``[C, C]`` decay matrix per head and matmuls (``scalar_decay.py``).

With ``strictly_causal=True`` (RWKV-6) the output at i reads the state
before token i: step 3 reads with the decay up to i - 1 (``L`` shifted by
one), and step 4 drops the diagonal and the gate of i itself, so offset
``d`` carries ``exp(sum_{j<m<i} g_m)``.

Segment ids enter as masks: a pair ``(i, j)`` counts only inside one
document, an entering state reaches ``i`` only if no document started
before ``i`` in the chunk (or sub-chunk), and a token reaches an end state
only if it is in the last document.

Steps 1-2 and 1, 3, 4 run as two passes over groups of chunks (``lax.map``,
rematerialised in the backward pass): only the chunk states ``[B, N, H, K,
V]`` are stored between them, never a ``[c, c, K]`` factor for the whole
sequence.

Letters: b batch, n chunk, s sub-chunk, i and j position in a sub-chunk
(or chunk), h head, k key channel, v value channel, g gate width (1 for a
scalar decay per head, K for a decay per key channel).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks, dispatch
from lin_attn_jax.ops.common.chunking import merge_chunks, pad_time, split_chunks
from lin_attn_jax.ops.common.decay import reverse_exclusive_cumsum
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate
from lin_attn_jax.ops.gated_linear.scalar_decay import scalar_decay_outputs
from pallas_kernels.gated_linear import chunk_gated_linear_attention

_F32 = jnp.float32
# Tokens whose intra-chunk factors are alive at once (memory, not results).
_TOKENS_PER_GROUP = 512


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


# Products summed over the last axis, and rows scaled by a vector, are
# written as dot_general: XLA:CPU runs them several times faster than a
# multiply followed by a reduction (which is also what autodiff of a
# broadcast multiply produces).

def _dot_last(a, b):
  """``sum(a * b, -1)`` for equal shapes."""
  return jnp.einsum("...k,...k->...", a, b, preferred_element_type=_F32)


def _scale_rows(d, s):
  """``d[..., None] * s``: ``d [..., K]`` (or ``[..., 1]``) scales the rows
  of ``s [..., K, V]``."""
  if d.shape[-1] != s.shape[-2]:
    return d[..., None] * s
  return jnp.einsum("...k,...kv->...kv", d, s, preferred_element_type=_F32)


def _shift(x, d):
  """``out[:, :, :, i] = x[:, :, :, i - d]`` within each sub-chunk, 0 for i < d."""
  if d == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[3] = (d, 0)
  return jnp.pad(x[:, :, :, :x.shape[3] - d], widths)


def _diagonal_outputs(q_s, k_s, v_s, g_s, doc_s, strict=False):
  """Step 4: the part of each output from its own sub-chunk, exactly.

  Offset by offset (``d = i - j``), the decay ``exp(sum_{j<m<=i} g_m)`` is
  carried as a running product of per-token decays ``exp(g) <= 1`` (exact
  relative to the result, no ``exp`` of a difference, zero above the
  diagonal by construction); ``d = 0`` has decay 1 and no gate.

  q_s, k_s: ``[B, N, S, c, H, K]`` (q scaled); v_s: ``[B, N, S, c, H, V]``;
  g_s: ``[B, N, S, c, H, G]``; doc_s: ``[B, N, S, c]`` or None (one
  document); strict: i reads the state before its token (no ``d = 0``, and
  offset d decays over ``j < m < i``). Returns ``[B, N, S, c, H, V]``.

  The backward pass is written by hand (``_diagonal_bwd_impl``): it walks
  the offsets once more, forward, instead of storing every offset's running
  product as autodiff of the loop would.
  """
  if doc_s is None:
    return _diagonal_one_document(q_s, k_s, v_s, g_s, strict)
  return _diagonal_packed(q_s, k_s, v_s, g_s, doc_s, strict)


def _first(x, n):
  """Positions ``0 .. n-1`` of each sub-chunk (axis 3)."""
  return x[:, :, :, :n]


def _last(x, n):
  """Positions ``c-n .. c-1`` of each sub-chunk (axis 3)."""
  return x[:, :, :, x.shape[3] - n:]


def _pad(x, before, after):
  """Zeros before and after the positions of each sub-chunk (axis 3)."""
  widths = [(0, 0)] * x.ndim
  widths[3] = (before, after)
  return jnp.pad(x, widths)


def _offsets(g_s, doc_s, strict):
  """The pairs ``(i, j = i - d)`` of one sub-chunk, offset by offset.

  Yields ``(d, span, same)`` for ``d = 1 .. c-1``: ``span [B,N,S,c-d,H,G]``
  is the decay from j to i for ``i = d .. c-1`` (strict: over ``j < m <
  i``), a product of per-token decays ``exp(g) <= 1``: each offset's is the
  previous one's times one more token's decay, exact relative to the
  result, never the ``exp`` of a difference. ``same [B,N,S,c-d,1]`` says
  whether i and j are in one document (None for one document). Static
  slices: only the ``c - d`` pairs that exist are computed.
  """
  c = g_s.shape[3]
  decay = jnp.exp(g_s)                                          # [B,N,S,c,H,G]
  span = jnp.ones_like(decay)                                   # offset 0
  for d in range(1, c):
    span = _last(span, c - d)
    if not (strict and d == 1):                                 # not g_i itself
      span = span * decay[:, :, :, 1:c - d + 1]                 # m = i - d + 1
    same = None
    if doc_s is not None:
      same = (_last(doc_s, c - d) == _first(doc_s, c - d))[..., None]
    yield d, span, same


def _diagonal_forward(q_s, k_s, v_s, g_s, doc_s, strict):
  c = q_s.shape[3]
  o = (jnp.zeros_like(v_s) if strict
       else _dot_last(q_s, k_s)[..., None] * v_s)
  for d, span, same in _offsets(g_s, doc_s, strict):
    score = _dot_last(_last(q_s, c - d) * span, _first(k_s, c - d))
    if same is not None:
      score = jnp.where(same, score, 0.0)                       # [B,N,S,c-d,H]
    o = o + _pad(score[..., None] * _first(v_s, c - d), d, 0)
  return o


def _diagonal_bwd_impl(q_s, k_s, v_s, g_s, doc_s, strict, do):
  """Gradients of ``_diagonal_forward`` for the cotangent ``do``.

  With ``T[i, j, k] = ds_ij q_ik k_jk P_ijk`` (``ds_ij = do_i . v_j``, ``P``
  the decay from j to i), a gate ``g_m`` sits in ``P`` of every pair with
  ``j < m <= i`` (strict: ``j < m < i``), so its gradient is the sum of
  ``T`` over those pairs: with ``A_i = sum_j T[i, j]`` and ``B_j = sum_i
  T[i, j]``, ``dg_m = sum_{i>=m} A_i - sum_{j>=m} B_j`` (strict: the sums
  over ``> m``, minus ``B_m``). Both sums stay inside one sub-chunk, and
  both come from the gradients of q and k over the gated pairs: ``A = q *
  dq`` and ``B = k * dk`` (each term of ``dq_i`` is ``ds_ij k_j P_ij``).
  """
  c = q_s.shape[3]
  dq, dk = jnp.zeros_like(q_s), jnp.zeros_like(k_s)             # gated pairs
  if strict:
    dv = jnp.zeros_like(v_s)
    dq_free, dk_free = dq, dk                                   # neighbours
  else:
    d_diag = _dot_last(do, v_s)[..., None]                      # [B,N,S,c,H,1]
    dq_free, dk_free = d_diag * k_s, d_diag * q_s               # d = 0
    dv = _dot_last(q_s, k_s)[..., None] * do
  for d, span, same in _offsets(g_s, doc_s, strict):
    n = c - d                                                   # i = d .. c-1
    q_i, do_i = _last(q_s, n), _last(do, n)
    k_j, v_j = _first(k_s, n), _first(v_s, n)                   # j = i - d
    q_span = q_i * span
    score = _dot_last(q_span, k_j)                              # [B,N,S,n,H]
    d_score = _dot_last(do_i, v_j)
    if same is not None:
      score = jnp.where(same, score, 0.0)
      d_score = jnp.where(same, d_score, 0.0)
    d_score = d_score[..., None]
    dv = dv + _pad(score[..., None] * do_i, 0, d)
    dq_d = _pad(d_score * k_j * span, d, 0)
    dk_d = _pad(d_score * q_span, 0, d)
    if strict and d == 1:
      # Pairs of neighbours carry no gate; leaving them out of A and B
      # spares their exact cancellation in floating point.
      dq_free, dk_free = dq_free + dq_d, dk_free + dk_d
    else:
      dq, dk = dq + dq_d, dk + dk_d
  as_i, as_j = q_s * dq, k_s * dk
  if g_s.shape[-1] != q_s.shape[-1]:                            # scalar gate
    as_i, as_j = (jnp.sum(x, -1, keepdims=True) for x in (as_i, as_j))
  later = reverse_exclusive_cumsum(as_i - as_j, axis=3)         # sums over > m
  dg = later - as_j if strict else later + as_i - as_j
  return dq + dq_free, dk + dk_free, dv, dg


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _diagonal_one_document(q_s, k_s, v_s, g_s, strict):
  return _diagonal_forward(q_s, k_s, v_s, g_s, None, strict)


def _diagonal_one_document_fwd(q_s, k_s, v_s, g_s, strict):
  return (_diagonal_forward(q_s, k_s, v_s, g_s, None, strict),
          (q_s, k_s, v_s, g_s))


def _diagonal_one_document_bwd(strict, residuals, do):
  q_s, k_s, v_s, g_s = residuals
  return _diagonal_bwd_impl(q_s, k_s, v_s, g_s, None, strict, do)


_diagonal_one_document.defvjp(_diagonal_one_document_fwd,
                              _diagonal_one_document_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _diagonal_packed(q_s, k_s, v_s, g_s, doc_s, strict):
  return _diagonal_forward(q_s, k_s, v_s, g_s, doc_s, strict)


def _diagonal_packed_fwd(q_s, k_s, v_s, g_s, doc_s, strict):
  return (_diagonal_forward(q_s, k_s, v_s, g_s, doc_s, strict),
          (q_s, k_s, v_s, g_s, doc_s))


def _diagonal_packed_bwd(strict, residuals, do):
  q_s, k_s, v_s, g_s, doc_s = residuals
  grads = _diagonal_bwd_impl(q_s, k_s, v_s, g_s, doc_s, strict, do)
  return grads + (None,)


_diagonal_packed.defvjp(_diagonal_packed_fwd, _diagonal_packed_bwd)


def _decays(g_c, sub):
  """Step 1 for chunks ``g_c: [B, N, C, H, G]`` cut into sub-chunks of ``sub``.

  Returns (all ``[B, N, S, ...]``): ``g_s`` per-token gates, ``local``
  (sub-chunk start to i), ``local_to_end`` (j to sub-chunk end),
  ``sub_total``, ``before_sub`` (chunk start to sub-chunk start),
  ``after_sub`` (sub-chunk end to chunk end) and ``chunk_total [B, N, H, G]``.
  """
  g_s = split_chunks(g_c, sub, axis=2)                          # [B,N,S,c,H,G]
  local = jnp.cumsum(g_s, axis=3)
  local_to_end = reverse_exclusive_cumsum(g_s, axis=3)
  sub_total = local[:, :, :, -1]                                # [B,N,S,H,G]
  before_sub = jnp.concatenate(
      [jnp.zeros_like(sub_total[:, :, :1]),
       jnp.cumsum(sub_total, axis=2)[:, :, :-1]], axis=2)
  after_sub = reverse_exclusive_cumsum(sub_total, axis=2)
  chunk_total = jnp.sum(sub_total, axis=2)                      # [B,N,H,G]
  return (g_s, local, local_to_end, sub_total, before_sub, after_sub,
          chunk_total)


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
  _, _, local_to_end, _, _, after_sub, chunk_total = _decays(g_c, sub)
  to_end = merge_chunks(local_to_end + after_sub[:, :, :, None], axis=2)
  doc_last = doc_c[:, :, -1]                                    # [B, N]
  in_last_doc = (doc_c == doc_last[..., None])[..., None, None]
  k_to_end = jnp.where(in_last_doc, k_c * jnp.exp(to_end), 0.0)  # [B,N,C,H,K]
  own = _mm("bnjhk,bnjhv->bnhkv", k_to_end, v_c)                # [B,N,H,K,V]
  passes = (doc_last == doc_before)[..., None, None]            # [B, N, 1, 1]
  return own, jnp.where(passes, jnp.exp(chunk_total), 0.0)


def _chunk_outputs(q_c, k_c, v_c, g_c, doc_c, doc_before, entering, *, sub,
                   packed, strict=False):
  """Steps 3 and 4: outputs of every chunk given the state entering it.

  Shapes as in ``_chunk_states``; ``entering: [B, N, H, K, V]``; ``packed``
  says whether there are several documents; ``strict``: outputs read the
  state before their token. Returns ``o [B, N, C, H, V]`` float32.
  """
  g_s, local, local_to_end, sub_total, _, _, _ = _decays(g_c, sub)
  q_s, k_s, v_s = (split_chunks(x, sub, axis=2) for x in (q_c, k_c, v_c))
  doc_s = split_chunks(doc_c, sub, axis=2)                      # [B,N,S,c]
  o = _diagonal_outputs(q_s, k_s, v_s, g_s, doc_s if packed else None,
                        strict=strict)                          # [B,N,S,c,H,V]
  read_decay = _shift(local, 1) if strict else local            # to i or i - 1

  # Which tokens the state entering their sub-chunk reaches, which tokens
  # reach the state leaving it, and whether a state passes a sub-chunk:
  # documents are known up front, so all masks and decays are batched here
  # and the walk over sub-chunks below is only ``S = decay * S + own``.
  doc_entering = jnp.concatenate([doc_before[:, :, None], doc_s[:, :, :-1, -1]],
                                 axis=2)                        # [B,N,S]
  doc_last = doc_s[:, :, :, -1]                                 # [B,N,S]
  reached = (doc_s == doc_entering[..., None])[..., None, None]
  in_last = (doc_s == doc_last[..., None])[..., None, None]     # [B,N,S,c,1,1]
  q_read = jnp.where(reached, q_s * jnp.exp(read_decay), 0.0)   # [B,N,S,c,H,K]
  k_write = jnp.where(in_last, k_s * jnp.exp(local_to_end), 0.0)
  passes = (doc_last == doc_entering)[..., None, None]          # [B,N,S,1,1]
  decay = jnp.where(passes, jnp.exp(sub_total), 0.0)            # [B,N,S,H,G]

  def sub_chunk_step(state, xs):
    q_i, k_j, v_j, decay_s = xs
    out = _mm("bnihk,bnhkv->bnihv", q_i, state)
    state = _scale_rows(decay_s, state) + _mm("bnjhk,bnjhv->bnhkv", k_j, v_j)
    return state, out

  _, from_state = jax.lax.scan(
      sub_chunk_step, entering,
      tuple(jnp.moveaxis(x, 2, 0) for x in (q_read, k_write, v_s, decay)))
  o = o + jnp.moveaxis(from_state, 0, 2)                        # [B,N,S,c,H,V]
  return merge_chunks(o, axis=2)


def _grouped_over_chunks(fn, operands, group):
  """``fn`` over groups of ``group`` chunks (axis 1), rematerialised.

  Mapping over groups and recomputing each group's intermediates in the
  backward pass keeps only one group's worth alive. The map runs over
  (batch row, group) pairs: ``[B, N, ...] -> [B * groups, group, ...]``
  is a reshape, where moving a group axis before the batch axis would copy
  every operand.
  """
  b, n = operands[0].shape[:2]
  if n <= group:
    return fn(*operands)
  steps = -(-n // group)

  def to_groups(x):
    x = jnp.pad(x, [(0, 0), (0, steps * group - n)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape((b * steps, group) + x.shape[2:])

  def from_groups(y):
    return y.reshape((b, steps * group) + y.shape[2:])[:, :n]

  def one_group(xs):
    return jax.tree.map(lambda y: y[0], fn(*(x[None] for x in xs)))

  out = jax.lax.map(jax.checkpoint(one_group),
                    tuple(to_groups(x) for x in operands))
  return jax.tree.map(from_groups, out)


def chunk_gated_linear(q, k, v, g=None, *, scale=None, initial_state=None,
                       output_final_state=False, segment_ids=None,
                       chunk_size=64, sub_chunk_size=8, impl="auto",
                       strictly_causal=False):
  """Gated linear attention, chunkwise; the training path on every backend.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: natural-log decay ``<= 0``, ``[B, T, H]`` (scalar per head) or
      ``[B, T, H, K]`` (per key channel), or None (no decay).
    scale: query scale, ``K ** -0.5`` when None.
    initial_state: ``[B, H, K, V]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk ``C`` (speed only, not results).
    sub_chunk_size: tokens per sub-chunk ``c``; must divide ``chunk_size``.
      Both are tile sizes of the XLA form; the Pallas kernels take theirs
      from ``pallas_kernels.gated_linear.BlockSizes.default``.
    impl: ``"auto"``, ``"xla"`` or ``"pallas"`` (see
      ``lin_attn_jax.ops.common.dispatch``): the Pallas kernel on TPU and
      GPU, or this chunk form in XLA.
    strictly_causal: ``o_t = S_{t-1}^T q_t``, the state before token t
      (RWKV-6), instead of ``S_t^T q_t``; the final state is the same. XLA
      only (``impl="pallas"`` raises).
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
  checks.check_chunk_size(chunk_size)
  checks.check_chunk_size(sub_chunk_size, "sub_chunk_size")
  if chunk_size % min(sub_chunk_size, chunk_size):
    raise ValueError(f"sub_chunk_size ({sub_chunk_size}) must divide "
                     f"chunk_size ({chunk_size})")
  dispatch.check_impl(impl)
  scale = default_scale(scale, dk)
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
  pallas = functools.partial(
      chunk_gated_linear_attention, q, k, v, g, scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)
  return dispatch.run(impl, xla, pallas)


def _chunk_xla(q, k, v, g, *, scale, initial_state, output_final_state,
               segment_ids, chunk_size, sub_chunk_size, strictly_causal):
  """The chunk form in XLA; ``g`` validated (``[B, T, H, G]`` or None)."""
  b, t, h, dk = q.shape
  dv = v.shape[-1]
  c = min(sub_chunk_size, chunk_size)
  # A sequence shorter than a chunk only needs enough whole sub-chunks.
  chunk = min(chunk_size, -(-t // c) * c)
  subs = chunk // c
  if g is None:
    g = jnp.zeros((b, t, h, 1), _F32)
  doc = document_index(segment_ids, b, t)                       # [B, T]

  out_dtype = v.dtype
  q, k, g, v = (pad_time(jnp.asarray(x, _F32), chunk) for x in (q, k, g, v))
  doc = pad_time(doc, chunk, mode="edge")
  n = q.shape[1] // chunk
  doc_c = split_chunks(doc, chunk)                              # [B, N, C]
  doc_before = jnp.concatenate([jnp.zeros((b, 1), doc.dtype), doc[:, :-1]],
                               axis=1)[:, ::chunk]              # [B, N]
  per_chunk = (split_chunks(scale * q, chunk), split_chunks(k, chunk),
               split_chunks(v, chunk), split_chunks(g, chunk), doc_c,
               doc_before)
  group = max(1, _TOKENS_PER_GROUP // chunk)

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
    o = _grouped_over_chunks(
        functools.partial(_chunk_outputs, sub=c, packed=packed,
                          strict=strictly_causal),
        per_chunk + (entering,), group)
  o = merge_chunks(o)[:, :t]
  return o.astype(out_dtype), (final_state if output_final_state else None)
