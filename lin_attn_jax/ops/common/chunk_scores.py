"""Intra-chunk score matrices, and the halving that builds them.

The delta-rule chunk forms (WY representation) solve a triangular system in
the ``[C, C]`` matrix of key-key scores of each chunk, so unlike the
gated-linear-attention chunk form they cannot stream the intra-chunk part;
these stages build the matrices

    A[i, j] = x_i . (exp(sum_{j < m <= i} g_m) * y_j)      j <= i
    A[i, j] = x_i . (exp(sum_{j < m < i} g_m) * y_j)       j < i   (strict)

(the strict kind reads the state before token i: RWKV-6's output, RWKV-7's
state read) for a log-decay ``g`` that is a scalar per head or one per key
channel. A scalar decay gives the ``[C, C]`` factor ``exp(sum_{j < m <= i}
g_m)`` directly (``segsum``). A decay per key channel would need a ``[C, C,
K]`` factor; instead the pairs are found by halving (the gated-linear chunk
form computes its in-chunk pairs the same way):

- a block of ``2h`` tokens; its pairs with ``j`` in the left half and ``i``
  in the right half factor through the middle, ``exp(sum_{mid < m <= i}
  g_m) * exp(sum_{j < m <= mid} g_m)``: two decays ``<= 1`` that scale
  ``x_i`` and ``y_j``, so the block's pairs are one ``[h, h]`` matmul;
- the pairs inside each half are the same problem at half the size, down to
  single tokens: ``log2(C)`` levels, and every pair ``j < i`` lies in exactly
  one block of one level, so the levels' blocks tile the strictly lower
  triangle of the ``[C, C]`` matrix; the diagonal is ``x_i . y_i`` (0 when
  strict).

A short chunk (``MAX_BATCHED_SIZE`` tokens) takes every level in one
batched matmul, each level's blocks stacked into one ``[C/2, C/2]`` product
whose block diagonal holds them, and places the pairs with one gather
(``_batched_level_scores``): a few kernels for all levels, where joining
them level by level (``join_blocks``, kept for whole sequences) compiles
several per level, forward and backward.

Every factor is ``exp`` of a sum of gates ``<= 0`` summed from its own terms,
so strong gates underflow to 0 where the true value is negligible and never
overflow, and no sum is the difference of two others: such a difference is
exact in value where it is 0, but its gradient is two large terms that
cancel only up to rounding, which swamps the small gradients of strong
gates. No ``[C, C, K]`` tensor is formed.

The exception, for callers that know a lower bound on the gates (RWKV-7's
log-decays are above ``-exp(-0.5)`` by construction) and take short chunks
(``factored_applies``): the factors are scaled from the chunk's start,
``(x_i exp(G_i)) . (y_j exp(-G_j))`` with ``G`` the sum of gates from the
chunk's start, one ``[aC, bC]`` product for every pair of every ``x`` and
``y``, no halving. Its exponents are differences of sums; with the gates'
span in a chunk at most ``MAX_FACTORED_SPAN`` the factors stay finite and
the rounding of the difference (``|G| * 2^-24``) stays near float32's own.

Letters: p block of a level, i and j position in a block (or chunk), k key
channel, g gate width (1 or K); leading axes (batch, chunk, head) are
``...``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.products import mm_nt
from lin_attn_jax.ops.common.decay import segsum, shift

_F32 = jnp.float32


def dot_last(a, b):
  """``sum(a * b, -1)`` for equal shapes, as a ``dot_general`` (XLA:CPU runs
  it several times faster than a multiply followed by a reduction)."""
  return jnp.einsum("...k,...k->...", a, b, preferred_element_type=_F32)


def power_of_two(n: int) -> int:
  """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
  return 1 << max(n - 1, 0).bit_length()


def halves(x, half: int, axis: int):
  """Blocks of ``2 * half`` tokens along ``axis`` -> their left and right
  halves, each with ``axis`` split into ``[P, half]``."""
  axis = axis % x.ndim
  blocks = x.shape[axis] // (2 * half)
  x = x.reshape(x.shape[:axis] + (blocks, 2, half) + x.shape[axis + 1:])
  # unstack, not two slices: its gradient is one stack of the two
  # cotangents, where two slices' are two padded copies summed.
  return tuple(jnp.unstack(x, axis=axis + 1))


def level_log_decays(g, axis: int, strict=False):
  """The two log-decays of every halving level, by doubling.

  Args:
    g: log-decays, the token axis ``axis`` a power of two.
    strict: the read side stops before ``i``.
  Returns:
    ``(levels, (to_here, to_end))``. ``levels`` is ``{half: (to_i,
    from_j)}`` for ``half = 1, 2, ..., size / 2``, ``axis`` split into
    ``[P, half]`` (blocks of ``2 * half`` tokens): ``to_i`` for ``i`` in
    the right half, ``sum_{mid < m <= i} g_m`` (``mid < m < i`` when
    strict), and ``from_j`` for ``j`` in the left half, ``sum_{j < m <=
    mid} g_m``. ``to_here`` and ``to_end``, shaped like ``g``, are the
    whole axis's sums from its start to ``i`` (``i`` included) and from
    after ``i`` to its end: the doubling's last step.

  The sums inside aligned blocks of ``2 * width`` tokens are those inside
  its two halves plus the other half's total (a sum of other terms, never a
  difference): ``log2(C)`` passes over ``g``, where a cumulative sum per
  level costs ``half`` additions per entry.
  """
  axis = axis % g.ndim
  size = g.shape[axis]
  upto = g                        # sum from the block's start to i, i included
  after = jnp.zeros_like(g)       # sum from after j to the block's end
  levels = {}
  width = 1
  while width < size:
    (upto_left, upto_right), (after_left, after_right) = (
        halves(x, width, axis) for x in (upto, after))
    levels[width] = (shift(upto_right, 1, axis=axis + 1) if strict
                     else upto_right, after_left)
    total_left, total_right = (
        jax.lax.slice_in_dim(x, width - 1, width, axis=axis + 1)
        for x in (upto_left, upto_right))
    upto, after = (
        jnp.stack(pair, axis=axis + 1).reshape(g.shape)
        for pair in ((upto_left, upto_right + total_left),
                     (after_left + total_right, after_right)))
    width *= 2
  return levels, (upto, after)


def join_blocks(diagonal, lower):
  """``[[D1, 0], [L, D2]]`` from diagonal blocks and lower-left blocks.

  Args:
    diagonal: ``[..., 2P, h, h]`` (``D1, D2`` are blocks ``2p, 2p + 1``).
    lower: ``[..., P, h, h]``.
  Returns:
    ``[..., P, 2h, 2h]``.
  """
  p, h = lower.shape[-3], lower.shape[-1]
  pairs = diagonal.reshape(diagonal.shape[:-3] + (p, 2, h, h))
  upper_left, lower_right = jnp.unstack(pairs, axis=-3)
  return jnp.concatenate(
      [jnp.concatenate([upper_left, jnp.zeros_like(upper_left)], axis=-1),
       jnp.concatenate([lower, lower_right], axis=-1)], axis=-2)


# The factored scores' write factors reach ``exp(span)`` where a chunk's
# gates sum to ``-span``: at 40, 2.4e17, far below float32's largest (3.4e38)
# even times inputs of a thousand on each side.
MAX_FACTORED_SPAN = 40.0


def factored_applies(size: int, min_log_decay) -> bool:
  """Whether chunks of ``size`` tokens whose gates are all ``>=
  min_log_decay`` (a Python float, or None: no bound) take the factored
  scores."""
  return (min_log_decay is not None
          and size * -float(min_log_decay) <= MAX_FACTORED_SPAN)


def _gate_sums(g, to_end=False):
  """Sums of ``g [..., C, G]`` along its tokens, by a 0/1 matrix (each the
  sum of its own gates): from the chunk's start to ``i`` included, or (with
  ``to_end``) from after ``i`` to the chunk's end."""
  c = g.shape[-2]
  lower = np.tril(np.ones((c, c), np.float32), -1 if to_end else 0)
  return jnp.einsum("ij,...jg->...ig", jnp.asarray(lower.T if to_end
                                                   else lower), g,
                    precision=jax.lax.Precision.HIGHEST,
                    preferred_element_type=_F32)


def _factored_scores(xs, ys, g, strict):
  """Every pair's score from factors scaled from the chunk's start: ``x_i
  exp(G_i)`` (``G_{i-1}`` when strict) and ``y_j exp(-G_j)``, one product
  for all of them. Returns ``intra_chunk_scores``' ``(scores, (to_here,
  to_end, total))``."""
  c = g.shape[-2]
  to_here = _gate_sums(g)
  # Before i: the sums to i shifted by one (what the strict callers' own
  # decays of step 1 use too, so the two are one computation).
  read = {s: jnp.exp(shift(to_here, 1, axis=-2) if s else to_here)
          for s in set(strict)}
  write = jnp.exp(-to_here)
  products = mm_nt(
      jnp.concatenate([x * read[s] for x, s in zip(xs, strict)], axis=-2),
      jnp.concatenate([y * write for y in ys], axis=-2))      # [...,aC,bC]
  products = products.reshape(products.shape[:-2]
                              + (len(xs), c, len(ys), c))
  scores = []
  for a, s in enumerate(strict):
    causal = jnp.asarray(np.tril(np.ones((c, c), bool), -1 if s else 0))
    scores.append([jnp.where(causal, products[..., a, :, b, :], 0.0)
                   for b in range(len(ys))])
  return scores, (to_here, _gate_sums(g, to_end=True), to_here[..., -1, :])


def _scalar_decay_scores(x, y, g, strict):
  """A scalar decay per head: ``(x y^T) * exp(pair sums)``, ``[..., C, C]``."""
  pair = segsum(g[..., 0], axis=-1)                             # [..., i, j]
  if strict:
    pair = jnp.concatenate([jnp.full_like(pair[..., :1, :], -jnp.inf),
                            pair[..., :-1, :]], axis=-2)
  return mm_nt(x, y) * jnp.exp(pair)


# Chunks of at most this many tokens build their scores with every level at
# once (``_batched_level_scores``): fewer kernels to compile, as fast to run
# at 16 (the CPU default). Longer ones (chunks of 64, the accelerators'
# default, and whole sequences in the parallel forms) join the levels'
# blocks level by level: at 64 the batched products are 1.5x the work and
# memory of the ``[C, C]`` scores, for no speed (see docs/performance.md).
MAX_BATCHED_SIZE = 16
_GATE_FLOOR = -1e30


@functools.lru_cache(maxsize=None)
def _pair_positions(size: int):
  """Where each pair ``(i, j)`` of a chunk of ``size`` tokens (a power of
  two) lies in the flat scores of ``_batched_level_scores``.

  The flat scores of one pair of operands are the levels' products
  ``[L, n, n]`` (``n = size / 2``: row ``p h + r`` the ``r``-th token of the
  right half of block ``p``, column likewise in the left half), then the
  ``size`` diagonal entries, then one zero. Returns ``(take [size, size],
  back [L n n + size + 1])``: ``take`` the flat index of every entry (the
  zero above the diagonal), ``back`` for each flat index the entry that
  reads it (``size * size``, a zero, where none does: products across
  blocks and the zero itself). Every flat index below the zero is read at
  most once, so the gradient is a gather too.
  """
  n, levels = size // 2, size.bit_length() - 1
  diagonal, zero = levels * n * n, levels * n * n + size
  take = np.full((size, size), zero, np.int32)
  back = np.full((zero + 1,), size * size, np.int32)
  for i in range(size):
    take[i, i] = diagonal + i
    for j in range(i):
      half = 1 << ((i ^ j).bit_length() - 1)
      row = (i // (2 * half)) * half + i % half
      col = (j // (2 * half)) * half + j % half
      take[i, j] = (half.bit_length() - 1) * n * n + row * n + col
  for flat, at in enumerate(take.reshape(-1)):
    if at != zero:
      back[at] = flat
  return take, back


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _place_pairs(flat, size):
  """``flat [..., L n n + size + 1] -> [..., size, size]`` by
  ``_pair_positions``."""
  take, _ = _pair_positions(size)
  return jnp.take(flat, jnp.asarray(take), axis=-1)


def _place_pairs_fwd(flat, size):
  return _place_pairs(flat, size), None


def _place_pairs_bwd(size, _, ct):
  _, back = _pair_positions(size)
  ct = ct.reshape(ct.shape[:-2] + (size * size,))
  ct = jnp.concatenate([ct, jnp.zeros(ct.shape[:-1] + (1,), ct.dtype)],
                       axis=-1)
  return (jnp.take(ct, jnp.asarray(back), axis=-1),)


_place_pairs.defvjp(_place_pairs_fwd, _place_pairs_bwd)


@functools.lru_cache(maxsize=None)
def _level_rows(size: int):
  """0/1 matrices ``[L n, size]`` that stack every level's rows (level
  ``h = 1, 2, ..., size / 2`` in that order, row ``p h + r`` within it for
  the ``r``-th token of a half of block ``p``): ``right`` and ``left``
  select the tokens of the right and left halves; ``to``, ``to_strict``
  and ``from`` sum the gates ``mid < m <= i``, ``mid < m < i`` and ``j < m
  <= mid`` (the same sums as ``level_log_decays``)."""
  n = size // 2
  out = {name: [] for name in ("to", "to_strict", "from", "right", "left")}
  half = 1
  while half < size:
    level = {name: np.zeros((n, size), np.float32) for name in out}
    for p in range(size // (2 * half)):
      start = p * 2 * half + half                 # the right half's first
      for r in range(half):
        i, j, row = start + r, p * 2 * half + r, p * half + r
        level["to"][row, start:i + 1] = 1
        level["to_strict"][row, start:i] = 1
        level["from"][row, j + 1:start] = 1
        level["right"][row, i] = 1
        level["left"][row, j] = 1
    for name in out:
      out[name].append(level[name])
    half *= 2
  return {name: np.concatenate(mats) for name, mats in out.items()}


def _batched_level_scores(xs, ys, g, strict, diagonal):
  """Every level's blocks in one batched matmul, placed by one gather.

  Level ``h`` needs the products of the right halves (read side) and left
  halves (write side) of its blocks of ``2h`` tokens; stacked over its
  ``P`` blocks they are ``n = size / 2`` rows on each side, for every
  level. One ``[n, n]`` product per level (and pair of operands) holds the
  ``[h, h]`` products of each block on its block diagonal, next to
  products across blocks that no pair reads (finite: their factors are
  ``<= 1``). ``L / 4`` times the work of one ``[size, size]`` product, in
  one matmul instead of ``2 L`` small ones and ``L`` joins.

  The stacked rows of every level (the halves' tokens, and the log-decays
  from the middle, each the sum of its own span of gates) come from one
  matmul each with a constant 0/1 matrix (``_level_rows``), in place of the
  doubling and ``L`` slices each: ``L size^2 / 2`` products per channel,
  cheap for the short chunks this serves.
  """
  size = g.shape[-2]
  n, n_levels = size // 2, size.bit_length() - 1
  rows = _level_rows(size)

  def select(name, z):  # [...,L,n,*]
    # A 0/1 matrix: at full precision, exact rows and sums of gates.
    out = jnp.einsum("rc,...ck->...rk", jnp.asarray(rows[name]), z,
                     precision=jax.lax.Precision.HIGHEST,
                     preferred_element_type=_F32)
    return out.reshape(out.shape[:-2] + (n_levels, n, out.shape[-1]))

  # A gate of -inf (a full reset) times a 0 of the matrix would be NaN; at
  # -1e30 its decay is the same exact 0, and so is its gradient.
  g = jnp.maximum(g, _GATE_FLOOR)
  read = {s: jnp.exp(select("to_strict" if s else "to", g))
          for s in set(strict)}  # [...,L,n,G]
  write = jnp.exp(select("from", g))
  x_read = jnp.concatenate([select("right", x) * read[s]
                            for x, s in zip(xs, strict)],
                           axis=-2)  # [...,L,an,K]
  y_write = jnp.concatenate([select("left", y) * write
                             for y in ys], axis=-2)  # [...,L,bn,K]
  products = mm_nt(x_read, y_write)  # [...,L,an,bn]
  lead = products.shape[:-3]
  products = products.reshape(lead + (n_levels, len(xs), n, len(ys), n))
  products = jnp.moveaxis(products, (-4, -2), (-5, -4))  # [...,a,b,L,n,n]
  flat = jnp.concatenate(
      [products.reshape(products.shape[:-3] + (-1,)), diagonal,
       jnp.zeros(diagonal.shape[:-1] + (1,), _F32)], axis=-1)
  return _place_pairs(flat, size)  # [...,a,b,C,C]


def _joined_level_scores(xs, ys, g, strict, diagonal):
  """The levels' blocks joined level by level (no products across blocks):
  for long chunks, where ``_batched_level_scores`` would hold ``L / 4``
  times the ``[size, size]`` scores."""
  blocks = diagonal[..., :, None, None]                         # [...,a,b,C,1,1]
  levels, chunk_sums = level_log_decays(g, axis=-2)
  for half, (to_i, from_j) in levels.items():
    # to_i, from_j: [..., P, h, G]
    read = {s: jnp.exp(shift(to_i, 1, axis=-2) if s else to_i)
            for s in set(strict)}
    write = jnp.exp(from_j)
    x_read = jnp.concatenate([halves(x, half, -2)[1] * read[s]
                              for x, s in zip(xs, strict)], axis=-2)
    y_write = jnp.concatenate([halves(y, half, -2)[0] * write for y in ys],
                              axis=-2)
    lower = mm_nt(x_read, y_write)                              # [...,P,ah,bh]
    lower = lower.reshape(lower.shape[:-2]
                          + (len(xs), half, len(ys), half))     # [...,P,a,h,b,h]
    lower = jnp.moveaxis(lower, (-4, -2), (-5, -4))             # [...,a,b,P,h,h]
    # One join for every pair of the level.
    blocks = join_blocks(blocks, lower)                     # [...,a,b,P,2h,2h]
  return blocks[..., 0, :, :], chunk_sums                       # [...,a,b,C,C]


def intra_chunk_scores(xs, ys, g, strict=False, with_decays=False,
                       min_log_decay=None):
  """Causal decay-weighted scores of every pair of ``xs`` and ``ys``.

  Args:
    xs: sequence of ``[..., C, K]`` float32, the reading side (queries).
    ys: sequence of ``[..., C, K]`` float32, the written side (keys).
    g: ``[..., C, G]`` log-decay, ``G`` 1 or ``K``.
    strict: one bool, or one per ``x``: row i reads the state before token
      i (0 on the diagonal, and a pair decays over ``j < m < i``).
    with_decays: also return the chunk's log-decays (those of
      ``common.decay.chunk_log_decays``); the halving finds them on the
      way.
    min_log_decay: a lower bound on every gate (a Python float ``<= 0``)
      that the caller guarantees, or None. Where ``factored_applies``, the
      scores are products of factors scaled from the chunk's start (module
      docstring): one matmul, no halving.
  Returns:
    ``scores[a][b]``, ``[..., C, C]`` for ``xs[a]`` and ``ys[b]``, 0 above
    the diagonal (and on it when strict); with ``with_decays``, ``(scores,
    (to_here, to_end, total))``: from the chunk start to i (i included) and
    from after i to the chunk end, shaped like ``g``, and the whole chunk's
    ``[..., G]``, each the sum of its own gates.
  """
  strict = (tuple(strict) if isinstance(strict, (tuple, list))
            else (strict,) * len(xs))
  c = g.shape[-2]
  size = power_of_two(c)

  def out(scores, chunk_sums=None):
    if not with_decays:
      return scores
    if chunk_sums is None:
      chunk_sums = level_log_decays(pad_time(g, size, axis=-2), axis=-2)[1]
    to_here, to_end = (x[..., :c, :] for x in chunk_sums)
    return scores, (to_here, to_end, to_here[..., -1, :])

  if g.shape[-1] == 1:
    return out([[_scalar_decay_scores(x, y, g, s) for y in ys]
                for x, s in zip(xs, strict)])
  if factored_applies(c, min_log_decay):
    scores, decays = _factored_scores(xs, ys, g, strict)
    return (scores, decays) if with_decays else scores
  if size != c:
    # Tokens after the chunk's end touch no pair of the chunk's tokens.
    xs, ys = ([pad_time(z, size, axis=-2) for z in zs] for zs in (xs, ys))
  # Letters a and b: the index of x in xs and of y in ys.
  diagonal = jnp.stack([
      jnp.stack([jnp.zeros(x.shape[:-1], _F32) if s else dot_last(x, y)
                 for y in ys], axis=-2)
      for x, s in zip(xs, strict)], axis=-3)                    # [...,a,b,C]
  if size <= MAX_BATCHED_SIZE:
    scores = (diagonal[..., None] if size == 1 else
              _batched_level_scores(xs, ys, pad_time(g, size, axis=-2),
                                    strict, diagonal))
    chunk_sums = None
  else:
    scores, chunk_sums = _joined_level_scores(
        xs, ys, pad_time(g, size, axis=-2), strict, diagonal)
  scores = scores[..., :c, :c]                                  # [...,a,b,C,C]
  return out([list(jnp.unstack(row, axis=-3))
              for row in jnp.unstack(scores, axis=-4)], chunk_sums)


def sequence_scores(x, y, g, mask, *, strict=False):
  """``intra_chunk_scores`` over a whole sequence taken as one chunk.

  Args:
    x, y: ``[B, T, H, K]`` float32; g: ``[B, T, H, G]`` log-decay;
      mask: ``[B, 1 or H, T, T]`` bool.
    strict: row i reads the state before token i.
  Returns:
    ``[B, H, T, T]``, 0 where ``mask`` is False.
  """
  x, y, g = (jnp.moveaxis(z, 1, 2) for z in (x, y, g))         # [B,H,T,*]
  scores = intra_chunk_scores((x,), (y,), g, strict=strict)[0][0]
  return jnp.where(mask, scores, 0.0)
