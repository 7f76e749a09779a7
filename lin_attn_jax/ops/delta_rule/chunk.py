"""Chunkwise delta rule with the WY (UT) representation.

Inside a chunk the delta rule is written as plain linear attention on
"pseudo-values" ``u_j`` that are found with one small unit-lower-triangular
system per chunk; everything else is matmuls. The derivation is in this folder's
README.md. Five steps:

1. Log-decays from the chunk start and to the chunk end, by doubling
   (``common.chunk_scores.level_log_decays``, whose levels the halving of
   step 2 uses): every decay factor below is ``exp`` of a sum of gates,
   <= 1, and no sum is the difference of two others.
2. Intra-chunk score matrices (``common.chunk_scores``; by halving for a
   decay per key channel, no ``[C, C, K]`` tensor):
   ``A[i, j] = beta_i k_i . (exp(G_i - G_j) * k_j)`` for ``j < i`` and
   ``P[i, j] = q_i . (exp(G_i - G_j) * k_j)`` for ``j <= i``, both masked
   to one document.
3. WY: ``[W | U] = (I + A)^{-1} diag(beta) [exp(G) * K | V]``: one small
   unit-lower-triangular inverse per chunk (``invert_unit_lower``, recursive
   blocks, matmuls only). The true pseudo-values are ``U - W S_in``.
4. Chunk transitions ``S_out = (D - K_end^T W) S_in + K_end^T U`` and a
   ``lax.scan`` over chunks for the state entering each chunk.
5. Outputs ``o = (exp(G) * Q) S_in + P (U - W S_in)``.

Steps 1-3 (``chunk_terms``) are chunk-local and run in XLA; with a decay
per key channel in long chunks, over groups of chunks that fit in cache,
recomputed in the backward pass (``common.chunking.map_chunk_groups``).
Steps 4-5, the
sequential sweep over chunks, run in XLA (``sweep_xla``) or, with
``impl="pallas"`` (or ``"auto"`` on GPU), as the Pallas kernels of
``pallas_kernels.delta_rule``, which walk the chunks with the state in
VMEM (TPU) or registers (GPU) and never form the ``[K, K]`` transitions.
``impl="pallas"`` on TPU, and in bfloat16 on CUDA, runs steps 1-5 on the
chunk-parallel kernels instead (``chunk_delta_rule``).

Letters: b batch, n chunk, i and j position in a chunk, h value
head (q and k are repeated to the value heads first), k and l key channels,
v value channel, g gate width (1 or K).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import (checks, context_parallel, dispatch,
                                    kernel_sharding)
from lin_attn_jax.ops.common.chunk_scores import (MAX_BATCHED_SIZE,
                                                  intra_chunk_scores,
                                                  join_blocks)
from lin_attn_jax.ops.common.chunking import (chunk_layout, chunks_in_budget,
                                             map_chunk_groups, merge_chunks,
                                             pad_time, split_chunks)
from lin_attn_jax.ops.common.decay import shift
from lin_attn_jax.ops.common.products import mm_nn, mm_tn
from lin_attn_jax.ops.common.segments import chunk_documents
from lin_attn_jax.ops.delta_rule import context_parallel as split
from lin_attn_jax.ops.delta_rule.inputs import (default_scale,
                                                expand_query_key, validate)
from pallas_kernels.delta_rule import (ChunkTerms, chunk_delta_rule_gpu,
                                       chunk_delta_rule_tpu,
                                       chunk_delta_rule_sweep)

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def document_masks(docs):
  """Masks of the chunk forms (head-major layout) from ``chunk_documents``.

  Returns:
    ``(same_doc [B, N, 1, C, C], reached [B, N, 1, C, 1], in_last_doc
    [B, N, 1, C, 1], passes [B, N, 1, 1])``: pairs inside one document,
    tokens that the entering state reaches (no document started in the chunk
    at or before them), tokens that reach the chunk's end state, and chunks
    whose entering state survives to their end. All True (no masking work)
    for ``docs=None``.
  """
  if docs is None:
    return (True,) * 4
  doc_c, doc_before = docs
  doc_last = doc_c[:, :, -1]                                    # [B, N]
  same_doc = (doc_c[..., :, None] == doc_c[..., None, :])[:, :, None]
  reached = (doc_c == doc_before[..., None])[:, :, None, :, None]
  in_last_doc = (doc_c == doc_last[..., None])[:, :, None, :, None]
  passes = (doc_last == doc_before)[..., None, None]
  return same_doc, reached, in_last_doc, passes


def scan_chunk_states(transition, own, state0, diagonal=None):
  """``S_{n+1} = (diag(diagonal_n) + transition_n) S_n + own_n`` over chunks.

  Args:
    transition: ``[B, N, H, K, K]``; own: ``[B, N, H, K, V]``;
    state0: ``[B, H, K, V]``; diagonal: ``[B, N, H, G]`` (``G`` 1 or
      ``K``) or None: a diagonal part of the transition, kept apart so that
      no ``[K, K]`` identity is broadcast and added (nor its gradient
      summed back).
  Returns:
    ``(final state [B, H, K, V], entering states [B, N, H, K, V])``.

  The gradient is written out (``_scan_states_bwd``): a reverse scan that
  carries only the states' cotangent, one product per chunk, where
  autodiff's reverse scan also forms and stacks each chunk's ``[K, K]``
  transition gradient step by step; those come after it from one batched
  product of the cotangents and the entering states.
  """
  return _scan_states(transition, own, state0, diagonal)


def _affine_scan(steps, adds, init, diagonal, reverse=False):
  """``x_{n+1} = (diag(diagonal_n) + steps_n) x_n + adds_n`` over axis 1
  (from the last ``n`` down when ``reverse``): ``(last x, the x entering
  each step [B, N, H, K, V])``."""
  def carry(x, inputs):
    step, add, diag = inputs                  # [B,H,K,K], [B,H,K,V], [B,H,G]
    new = _mm("bhkl,bhlv->bhkv", step, x) + add
    if diag is not None:
      new = new + diag[..., :, None] * x
    return new, x

  last, entering = jax.lax.scan(
      carry, init,
      tuple(None if x is None else jnp.moveaxis(x, 1, 0)
            for x in (steps, adds, diagonal)), reverse=reverse)
  return last, jnp.moveaxis(entering, 0, 1)


@jax.custom_vjp
def _scan_states(transition, own, state0, diagonal):
  return _affine_scan(transition, own, state0, diagonal)


def _scan_states_fwd(transition, own, state0, diagonal):
  final, entering = _affine_scan(transition, own, state0, diagonal)
  return (final, entering), (transition, diagonal, entering)


def _scan_states_bwd(res, cotangents):
  """With ``lam_{n+1}`` the cotangent of ``S_{n+1}`` (the final state's for
  ``n + 1 = N``): ``lam_n = d entering_n + M_n^T lam_{n+1}``, ``M_n`` the
  transition; ``d own_n = lam_{n+1}``, ``d transition_n = lam_{n+1}
  S_n^T``, ``d diagonal_n`` the matching sum, ``d state0 = lam_0``."""
  transition, diagonal, entering = res
  d_final, d_entering = cotangents
  # The transitions transposed once, so that each step contracts the last
  # axis; the scan's "entering" values are the lam_{n+1}.
  d_state0, d_own = _affine_scan(jnp.swapaxes(transition, -1, -2),
                                 d_entering, d_final, diagonal,
                                 reverse=True)                  # [B,N,H,K,V]
  d_transition = _mm("bnhkv,bnhlv->bnhkl", d_own, entering)
  d_diagonal = None
  if diagonal is not None:
    d_diagonal = jnp.sum(d_own * entering, axis=-1)             # [B,N,H,K]
    if diagonal.shape[-1] == 1:
      d_diagonal = jnp.sum(d_diagonal, axis=-1, keepdims=True)
  return d_transition, d_own, d_state0, d_diagonal


_scan_states.defvjp(_scan_states_fwd, _scan_states_bwd)


SOLVE_BLOCK = 64


def solve_unit_lower(a, rhs):
  """``(I + a)^{-1} rhs`` for strictly lower ``a: [..., T, T]``, by matmuls.

  For the parallel forms (long systems): blocked forward substitution over
  ``SOLVE_BLOCK`` rows at a time, the diagonal blocks inverted by
  ``invert_unit_lower``, ``O(T^2)`` per column of ``rhs``. No LAPACK
  ``triangular_solve``: on CPU two of those running at once can starve XLA's
  intra-op thread pool and hang. The gradient is the transposed solve, by
  the same substitution. Entries of ``a`` on or above the diagonal are
  ignored.
  """
  return _solve(jnp.asarray(a, _F32), jnp.asarray(rhs, _F32))


@jax.custom_vjp
def _solve(a, rhs):
  return _forward_substitution(a, rhs)


def _forward_substitution(a, rhs):
  block = SOLVE_BLOCK
  t, width = a.shape[-1], rhs.shape[-1]
  if t <= block:
    return mm_nn(invert_unit_lower(a), rhs)
  n = -(-t // block)
  pad = n * block - t
  lead = a.shape[:-2]
  a = jnp.pad(a, [(0, 0)] * len(lead) + [(0, pad), (0, pad)])
  rhs = jnp.pad(rhs, [(0, 0)] * len(lead) + [(0, pad), (0, 0)])
  diagonal = jnp.einsum("...pipj->...pij",
                        a.reshape(lead + (n, block, n, block)))  # [...,N,c,c]
  inverses = invert_unit_lower(diagonal)                         # [...,N,c,c]
  rows = a.reshape(lead + (n, block, n * block))                 # [...,N,c,T']
  blocks = rhs.reshape(lead + (n, block, width))                 # [...,N,c,R]

  def substitute(x, inputs):
    i, row, inverse, b = inputs
    # Rows of the blocks not yet solved meet zeros in x.
    known = _mm("...it,...tr->...ir", row, x)                    # [..., c, R]
    x_i = _mm("...ij,...jr->...ir", inverse, b - known)          # [..., c, R]
    return jax.lax.dynamic_update_slice_in_dim(x, x_i, i * block, axis=-2), None

  x0 = jnp.zeros(lead + (n * block, width), _F32)                # [..., T', R]
  x, _ = jax.lax.scan(
      substitute, x0,
      (jnp.arange(n), jnp.moveaxis(rows, -3, 0), jnp.moveaxis(inverses, -3, 0),
       jnp.moveaxis(blocks, -3, 0)))
  return x[..., :t, :]


def _solve_forward(a, rhs):
  x = _forward_substitution(a, rhs)
  return x, (a, x)


def _solve_backward(residuals, dx):
  a, x = residuals
  # (I + a)^{-T} dx: with J the reversal of rows, J (I + a)^T J is unit
  # lower triangular, so the transposed solve is a forward substitution.
  flipped = jnp.flip(jnp.swapaxes(a, -1, -2), axis=(-2, -1))
  drhs = jnp.flip(_forward_substitution(flipped, jnp.flip(dx, axis=-2)),
                  axis=-2)                                       # [..., T, R]
  strictly_lower = jnp.tril(jnp.ones(a.shape[-2:], dtype=bool), -1)
  da = jnp.where(strictly_lower,
                 -_mm("...ir,...jr->...ij", drhs, x), 0.0)       # [..., T, T]
  return da, drhs


_solve.defvjp(_solve_forward, _solve_backward)


# Blocks up to this size are multiplied elementwise in ``invert_unit_lower``.
SMALL_BLOCK = 8


def _small_product(x, y):
  """``x @ y`` over the last two axes as a broadcast product and sum: for
  blocks of at most ``SMALL_BLOCK`` rows, which XLA fuses with their
  neighbours, where a ``dot`` of such blocks is a thunk of its own (see
  docs/performance.md)."""
  return jnp.sum(x[..., :, :, None] * y[..., None, :, :], axis=-2)


def invert_unit_lower(a):
  """``(I + a)^{-1}`` for strictly lower ``a: [..., C, C]``, by matmuls.

  Recursive 2x2 blocking: with ``L = [[L11, 0], [L21, L22]]``,
  ``L^{-1} = [[L11^{-1}, 0], [-L22^{-1} L21 L11^{-1}, L22^{-1}]]``, all
  diagonal blocks of one size at once, from 1x1 (the unit diagonal) up to
  ``C`` (padded to a power of two with identity rows); blocks up to
  ``SMALL_BLOCK`` are multiplied elementwise (``_small_product``). No
  powers of ``a`` are formed (unlike a Neumann series), so the error stays
  that of the blocks' products; on CPU this and its gradient are several
  times faster than a batched ``triangular_solve`` of small matrices.
  """
  c = a.shape[-1]
  p = 1 << (c - 1).bit_length()
  if p != c:
    a = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, p - c), (0, p - c)])
  lead = a.shape[:-2]
  inverse = jnp.ones(lead + (p, 1, 1), a.dtype)          # [..., p/m, m, m]
  m = 1
  while m < p:
    pairs = p // (2 * m)
    blocks = jnp.einsum("...pipj->...pij",
                        a.reshape(lead + (pairs, 2 * m, pairs, 2 * m)))
    inv = inverse.reshape(lead + (pairs, 2, m, m))
    inv11, inv22 = jnp.unstack(inv, axis=-3)
    product = _small_product if m <= SMALL_BLOCK else mm_nn
    lower = -product(product(inv22, blocks[..., m:, :m]),
                     inv11)                             # [..., pairs, m, m]
    inverse = join_blocks(inverse, lower)               # [..., pairs, 2m, 2m]
    m *= 2
  return inverse[..., 0, :c, :c]


def chunk_terms(q, k, erase, written, g, *, segment_ids, length, chunk,
                read_before_decay=False):
  """Steps 1-3: the WY terms of every chunk (no dependence on the state).

  The update of token i is "decay, read the state along the erase key
  ``e_i``, write ``k_i (x_i - S'_i^T e_i)^T``"; the delta rule's erase key
  is ``beta_i k_i`` and its written value ``x_i = beta_i v_i``, Gated
  DeltaNet-2's ``b_i * k_i`` and ``w_i * v_i`` (``../gdn2/README.md``).
  With ``read_before_decay`` token i reads ``S_{i-1}`` rather than ``S'_i
  = D_i S_{i-1}`` (Comba's ``S_i = D_i S_{i-1} + k_i (x_i - S_{i-1}^T
  e_i)^T``, ``../comba/README.md``): the rows of ``A`` and of the
  right-hand side decay over the tokens before i only.

  Args:
    q (scaled), k, erase: ``[B, T_pad, HV, K]``; written: ``[B, T_pad, HV,
      V]``; g: ``[B, T_pad, HV, G]``; all float32, padded to whole chunks
      of ``chunk`` tokens with zeros (a zero key writes nothing, a zero
      log-decay decays nothing).
    segment_ids: ``[B, T]`` or None; length: ``T``.
  Returns:
    ``ChunkTerms`` (head-major ``[B, N, HV, C, .]``): ``w``, ``u`` (before
    subtracting ``W S_in``), the queries ``q`` and keys ``k`` with their
    decays and masks, the scores ``P`` and the chunk decays.
  """
  docs = chunk_documents(segment_ids, q.shape[0], length, chunk) or ()

  def head_major(x):                                            # [B,N,H,C,...]
    return jnp.moveaxis(split_chunks(x, chunk), 3, 2)

  operands = tuple(head_major(x) for x in (q, k, erase, written, g)) + docs
  local_terms = functools.partial(_local_terms,
                                  read_before_decay=read_before_decay)
  if g.shape[-1] == 1 or chunk <= MAX_BATCHED_SIZE:
    return local_terms(*operands)
  # A decay per key channel in long chunks: the halving's levels make many
  # intermediates of the size of the keys: they run over groups of chunks
  # that fit in cache, rematerialised (see docs/performance.md).
  return map_chunk_groups(
      local_terms, operands,
      chunks_in_budget(chunk, q.shape[2] * max(chunk, *q.shape[3:],
                                                  *written.shape[3:])))


def _local_terms(q_h, k_h, e_h, x_h, g_h, *docs, read_before_decay=False):
  """``chunk_terms`` of the chunks given, head-major (``[B, N, HV, C,
  .]``; ``e`` the erase key, ``x`` the written value), with
  ``chunk_documents``' ``docs`` or none."""
  same_doc, reached, in_last_doc, passes = document_masks(docs or None)
  chunk = q_h.shape[-2]

  # Steps 1 and 2: intra-chunk scores, [B, N, H, C, C] each, and the
  # log-decays from the chunk start to i and from j to the chunk end.
  strictly_lower = jnp.tril(jnp.ones((chunk, chunk), dtype=bool), -1)
  ((ek,), (qk,)), (from_start, to_end, total) = intra_chunk_scores(
      (e_h, q_h), (k_h,), g_h, strict=(read_before_decay, False),
      with_decays=True)
  a = jnp.where(strictly_lower & same_doc, ek, 0.0)             # [B,N,H,C,C]
  qk = jnp.where(same_doc, qk, 0.0)

  # Step 3: W and U from one triangular inverse per chunk.
  dk = k_h.shape[-1]
  # The erase key reads the state before (or after) its own token's decay.
  e_decay = (shift(from_start, 1, axis=-2) if read_before_decay
             else from_start)                                   # [B,N,H,C,G]
  e_from_start = jnp.where(reached, e_h * jnp.exp(e_decay), 0.0)
  rhs = jnp.concatenate([e_from_start, x_h], axis=-1)           # [B,N,H,C,K+V]
  w, u = jnp.split(mm_nn(invert_unit_lower(a), rhs), [dk], axis=-1)
  return ChunkTerms(
      w=w, u=u,                                                 # [B,N,H,C,*]
      q=jnp.where(reached, q_h * jnp.exp(from_start), 0.0),     # [B,N,H,C,K]
      scores=qk,
      k=jnp.where(in_last_doc, k_h * jnp.exp(to_end), 0.0),     # [B,N,H,C,K]
      decay=jnp.where(passes, jnp.exp(total), 0.0))             # [B,N,H,G]


def sweep_xla(terms: ChunkTerms, state0):
  """Steps 4-5 in XLA: ``(o [B, N, H, C, V], final state [B, H, K, V])``.

  The chunk transitions ``S_out = (D - K_end^T W) S_in + K_end^T U`` and a
  ``lax.scan`` over chunks for the state entering each chunk, then the
  outputs ``o = (exp(G) * Q) S_in + P (U - W S_in)``.
  """
  transition = -mm_tn(terms.k, terms.w)                         # [B,N,H,K,K]
  own = mm_tn(terms.k, terms.u)                                 # [B,N,H,K,V]
  final_state, entering = scan_chunk_states(transition, own, state0,
                                            terms.decay)
  u = terms.u - mm_nn(terms.w, entering)                        # [B,N,H,C,V]
  o = mm_nn(terms.scores, u) + mm_nn(terms.q, entering)         # [B,N,H,C,V]
  return o, final_state


def sweep_forms(terms: ChunkTerms, *, initial_state, output_final_state,
                length, out_dtype, bf16_dots):
  """Steps 4-5 of the chunk forms: ``(xla, sweep_kernels)``, two callables
  that return ``(o [B, T, HV, V] in out_dtype, final state [B, HV, K, V]
  float32 or None)``, the sweep in XLA (``sweep_xla``) or as the Pallas
  sweep kernels (``pallas_kernels.delta_rule.chunk_delta_rule_sweep``,
  bfloat16 matmul operands when ``bf16_dots``).

  Args:
    terms: ``chunk_terms``' ``ChunkTerms``; initial_state: ``[B, HV, K,
      V]`` or None for zeros; length: ``T``, the tokens before padding.
  """
  bs, _, hv, _, dk = terms.k.shape
  dv = terms.u.shape[-1]

  def finish(o, final_state):
    o = merge_chunks(jnp.moveaxis(o, 2, 3))[:, :length]         # [B,T,HV,V]
    return (o.astype(out_dtype),
            final_state if output_final_state else None)

  def xla():
    state0 = (jnp.zeros((bs, hv, dk, dv), _F32) if initial_state is None
              else jnp.asarray(initial_state, _F32))
    return finish(*sweep_xla(terms, state0))

  def sweep_kernels():
    layouts = ChunkTerms(w="bnhck", u="bnhcv", q="bnhck", scores="bnhcc",
                         k="bnhck", decay="bnhg")
    return finish(*kernel_sharding.per_shard(
        lambda terms, initial_state: chunk_delta_rule_sweep(
            terms, initial_state=initial_state,
            output_final_state=output_final_state, bf16_dots=bf16_dots),
        dict(terms=terms, initial_state=initial_state),
        dict(terms=layouts, initial_state="bhkv"),
        ("bnhcv", "bhkv" if output_final_state else None), batch=bs,
        heads=hv))

  return xla, sweep_kernels



def chunk_erase_write(dtypes, core_inputs, *, scale, length, initial_state,
                      output_final_state, segment_ids, chunk_size,
                      sub_chunk_size, impl, read_before_decay=False):
  """The chunk form of a variant given by its erase keys and written values
  (Gated DeltaNet-2, Comba): steps 1-3 (``chunk_terms``) in XLA, steps 4-5
  (``sweep_forms``) in XLA or as the Pallas sweep kernels, by ``impl``.

  Args:
    dtypes: the variant's ``(q, k, v)`` as given: o is in v's dtype, and
      the kernels' matmul operands are bfloat16 when all three are.
    core_inputs: float32 ``(q, k, erase, written, g)``, ``[B, T, HV, *]``,
      q not yet scaled (``chunk_terms``' arguments).
    scale: the query scale; length: ``T``; read_before_decay: as in
      ``chunk_terms``; the rest as in ``chunk_delta_rule``.
  Returns:
    ``(o [B, T, HV, V], final_state [B, HV, K, V] float32 or None)``.
  """
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  dispatch.check_impl(impl)
  chunk, _ = chunk_layout(length, chunk_size, sub_chunk_size)
  q, k, erase, written, g = (pad_time(x, chunk) for x in core_inputs)
  terms = chunk_terms(scale * q, k, erase, written, g,
                      segment_ids=segment_ids, length=length, chunk=chunk,
                      read_before_decay=read_before_decay)
  xla, sweep_kernels = sweep_forms(
      terms, initial_state=initial_state,
      output_final_state=output_final_state, length=length,
      out_dtype=dtypes[2].dtype,
      bf16_dots=all(jnp.result_type(x) == jnp.bfloat16 for x in dtypes))
  return dispatch.run(impl, xla, sweep_kernels, family="delta_rule")

# The input dtypes that run the chunk-parallel kernels on CUDA and TPU
# (``pallas_kernels.delta_rule.chunk_delta_rule_gpu`` and
# ``chunk_delta_rule_tpu``). float32 inputs run the sweep kernels on CUDA,
# since the chunk-parallel sweeps' float32 state spills registers past 128
# key rows there.
GPU_CHUNK_DTYPES = (jnp.dtype(jnp.bfloat16),)
TPU_CHUNK_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))


def by_platform(*, cuda, tpu, default):
  """``cuda()`` when lowered for CUDA, ``tpu()`` for TPU, else
  ``default()`` (a name of its own so that tests can run either branch's
  kernels in interpret mode)."""
  return jax.lax.platform_dependent(cuda=cuda, tpu=tpu, default=default)


@context_parallel.splits_sequence(lambda: split.context_parallel_delta_rule)
def chunk_delta_rule(q, k, v, beta, g=None, *, scale=None, initial_state=None,
                     output_final_state=False, segment_ids=None,
                     chunk_size=64, sub_chunk_size=8, use_qk_l2norm=False,
                     impl="auto"):
  """The delta rule, chunkwise (WY representation); the training path.

  ``S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T``,
  ``o_t = S_t^T (scale * q_t)``. With ``g=None`` this is DeltaNet, with a
  scalar ``g`` per head Gated DeltaNet, with ``g`` per key channel KDA.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``, ``HV`` a multiple of ``H``
      (value head j uses query/key head ``j // (HV // H)``).
    beta: ``[B, T, HV]`` writing strength; in (0, 1) the state transition is
      a contraction for unit keys, in (0, 2) it may have negative eigenvalues.
    g: natural-log decay ``<= 0``: ``[B, T, HV]``, ``[B, T, HV, K]`` or None.
    scale: query scale, ``K ** -0.5`` when None.
    initial_state: ``[B, HV, K, V]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk (speed only, not results), for both
      implementations; the kernels pad a chunk's rows to their tiles.
    sub_chunk_size: divides ``chunk_size``; a sequence shorter than a chunk
      is one chunk of whole sub-chunks of this many tokens (speed only).
    use_qk_l2norm: L2-normalise q and k inside the op (unit keys keep the
      transition stable).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"`` (see
      ``lin_attn_jax.ops.common.dispatch``). ``"pallas"`` on TPU, and
      with bfloat16 inputs on CUDA, runs the whole chunk form on the
      chunk-parallel kernels of ``pallas_kernels.delta_rule``
      (``chunk_delta_rule_tpu``, ``chunk_delta_rule_gpu``);
      otherwise (and for ``"auto"`` on GPU) steps 1-3 (the WY terms
      of every chunk) run in XLA, differentiated by JAX's autodiff, and
      steps 4-5, the sweep over chunks, and its backward pass as Pallas
      kernels (``pallas_kernels.delta_rule``; bfloat16 matmul operands when
      q, k and v are bfloat16).
  Returns:
    ``(o [B, T, HV, V] in v's dtype, final_state [B, HV, K, V] float32 or
    None)``.

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 4, 32))
    >>> beta = jnp.full((1, 100, 4), 0.5); g = jnp.full((1, 100, 4), -0.1)
    >>> o, s = chunk_delta_rule(q, k, v, beta, g, use_qk_l2norm=True,
    ...                         output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 4, 32), (1, 4, 16, 32))
  """
  b, t, h, hv, dk, dv, g = validate(q, k, v, beta, g, initial_state,
                                    segment_ids)
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  dispatch.check_impl(impl)
  scale = default_scale(scale, dk)
  chunk, _ = chunk_layout(t, chunk_size, sub_chunk_size)
  g_given = g
  if g is None:
    g = jnp.zeros((b, t, hv, 1), _F32)
  out_dtype = v.dtype
  bf16 = all(jnp.result_type(x) == jnp.bfloat16 for x in (q, k, v))
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)              # [B,T,HV,K]
  kernel_inputs = dict(q=q.astype(out_dtype), k=k.astype(out_dtype), v=v,
                        beta=beta, g=g_given, initial_state=initial_state,
                        segment_ids=segment_ids)
  beta = jnp.asarray(beta, _F32)[..., None]                     # [B,T,HV,1]
  vf = jnp.asarray(v, _F32)
  q, k, erase, written, g = (pad_time(x, chunk) for x in (
      scale * q, k, beta * k, beta * vf, jnp.asarray(g, _F32)))
  terms = chunk_terms(q, k, erase, written, g, segment_ids=segment_ids,
                      length=t, chunk=chunk)
  xla, sweep_kernels = sweep_forms(
      terms, initial_state=initial_state,
      output_final_state=output_final_state, length=t, out_dtype=out_dtype,
      bf16_dots=bf16)

  def chunk_kernels(fn, dtypes):
    if out_dtype not in dtypes:
      return sweep_kernels()
    o, final_state = kernel_sharding.per_shard(
        functools.partial(fn, scale=scale,
                          output_final_state=output_final_state,
                          chunk_size=chunk_size),
        kernel_inputs,
        dict(q="bthk", k="bthk", v="bthv", beta="bth", g="bthg",
             initial_state="bhkv", segment_ids="bt"),
        ("bthv", "bhkv" if output_final_state else None), batch=b, heads=hv)
    return o.astype(out_dtype), final_state

  def pallas():
    return by_platform(
        cuda=lambda: chunk_kernels(chunk_delta_rule_gpu, GPU_CHUNK_DTYPES),
        tpu=lambda: chunk_kernels(chunk_delta_rule_tpu, TPU_CHUNK_DTYPES),
        default=sweep_kernels)

  # impl="auto" runs the sweep kernels, which a measurement on a GPU backs
  # (lin_attn_jax.ops.common.dispatch.AUTO_ON_CUDA).
  return dispatch.run(impl, xla, pallas, family="delta_rule",
                      auto_pallas=sweep_kernels)
