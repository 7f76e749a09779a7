"""The chunkwise form of S4D."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.chunking import (merge_chunks, pad_time,
                                              split_chunks)
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.s4d.complex_state import (complex_state, discretize,
                                                to_complex, to_pair)
from lin_attn_jax.ops.s4d.inputs import validate

_F32 = jnp.float32


def _chunk_operators(log_dt, A_real, A_imag, B, C, chunk: int, last: int):
  """The parameter-derived matrices of the chunk form (float32 unless said).

  With ``lam = exp(dtA)`` and ``L = chunk``:

  - ``toeplitz [D, L, L]``: ``K[tau - sigma]`` on and below the diagonal, 0
    above, ``K_l = 2 Re(sum_n C_n Bbar_n lam_n^l)`` (the kernel's first
    ``L`` taps): a chunk's own contribution to its outputs;
  - ``state_in [D, 2N, L]``: (real; imaginary) parts of ``lam^(L - 1 -
    sigma) Bbar``: a chunk's inputs to the state at its end;
  - ``read_out [D, 2N, L]``: ``2 Re`` and ``-2 Im`` of ``C lam^(tau + 1)``:
    the state before a chunk to its outputs (with the state as (real;
    imaginary));
  - ``decay [D, N]`` complex: ``lam^L``, across a whole chunk;
  - ``last_in, last_decay``: ``state_in`` and ``decay`` for a last chunk of
    ``last`` real tokens (the rest padding), for the final state.

  Every power is an ``exp(l dtA)`` with ``l >= 0``: decays ``<= 1``.
  """
  dt_a, b_bar = discretize(log_dt, A_real, A_imag, B)
  lags = jnp.arange(chunk + 1, dtype=_F32)
  powers = jnp.exp(lags * dt_a[..., None])                     # [D, N, L+1]
  c = to_complex(C)
  kernel = 2.0 * jnp.real(jnp.einsum("dn,dnl->dl", c * b_bar,
                                     powers[..., :chunk]))      # [D, L]
  tau, sigma = jnp.arange(chunk)[:, None], jnp.arange(chunk)[None, :]
  lag_of = (tau - sigma)[..., None] == jnp.arange(chunk)        # [L, L, L]
  toeplitz = jnp.einsum("dl,tsl->dts", kernel, lag_of.astype(_F32))

  def state_in(length):
    # lam^(length - 1 - sigma) Bbar for sigma < length, 0 after.
    w = jnp.flip(powers[..., :length], axis=-1) * b_bar[..., None]
    w = jnp.pad(w, ((0, 0), (0, 0), (0, chunk - length)))       # [D, N, L]
    return jnp.concatenate([jnp.real(w), jnp.imag(w)], axis=1)  # [D, 2N, L]

  w_out = c[..., None] * powers[..., 1:]                        # [D, N, L]
  read_out = jnp.concatenate([2.0 * jnp.real(w_out), -2.0 * jnp.imag(w_out)],
                             axis=1)                            # [D, 2N, L]
  return (toeplitz, state_in(chunk), read_out, powers[..., chunk],
          state_in(last), powers[..., last])


def _as_complex(pair_last):
  """``[..., 2N]`` (real; imaginary) -> complex ``[..., N]``."""
  n = pair_last.shape[-1] // 2
  return jax.lax.complex(pair_last[..., :n], pair_last[..., n:])


def _as_pair(z):
  """complex ``[..., N]`` -> ``[..., 2N]`` (real; imaginary)."""
  return jnp.concatenate([jnp.real(z), jnp.imag(z)], axis=-1)


# The longest chunk of ``chunk_s4d`` with documents: its masked Toeplitz
# product grows with the chunk length.
MASKED_CHUNK = 16


def chunk_s4d(u, log_dt, A_real, A_imag, B, C, *, D=None, initial_state=None,
              output_final_state=False, segment_ids=None, chunk_size=64):
  """H3's diagonal (S4D) SSM, chunkwise: matmuls and a scan over chunks.

  The SSM is time-invariant, so inside a chunk of ``L`` tokens its output is
  a ``[L, L]`` Toeplitz matrix of the kernel's first ``L`` taps times the
  chunk's inputs (per channel), and the state enters and leaves a chunk
  through fixed ``[2N, L]`` matrices:

  1. ``y_own = toeplitz @ u_chunk`` (every chunk at once);
  2. ``s_chunk = state_in @ u_chunk``, the state each chunk adds at its end;
  3. a ``lax.scan`` over chunks, ``x_next = lam^L x + s_chunk``, gives the
     state entering every chunk (``N`` complex modes per channel);
  4. ``y = y_own + read_out @ x_entering + D u``.

  The matrices depend on the parameters only (``O(D L^2 + D N L)``); no
  ``[T, ...]`` kernel is formed and there is no FFT. Work is ``O(T D (L +
  N))``, memory ``O(T D + (T / L) D N)``. With ``segment_ids`` the three
  products are masked per chunk by document: the Toeplitz product then
  holds a ``[B, T / L, D, L, L]`` mask product, so chunks are at most
  ``MASKED_CHUNK`` (16) tokens long: that product grows as ``L^2`` (see
  docs/performance.md).

  Args:
    u: ``[B, T, D]``.
    log_dt: ``[D]`` log time step.
    A_real: ``[D, N]``, ``< 0``; A_imag: ``[D, N]``.
    B, C: ``[D, N, 2]`` complex as (real, imaginary).
    D: ``[D]`` skip connection, or None.
    initial_state: ``[B, D, N, 2]`` float32 complex state, or None.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int; the state resets where the id changes.
    chunk_size: tokens per chunk (speed and memory only; at most
      ``MASKED_CHUNK`` with ``segment_ids``).
  Returns:
    ``(y [B, T, D] in u's dtype, final_state [B, D, N, 2] float32 or
    None)``.

  Example:
    >>> u = jnp.ones((2, 100, 8)); log_dt = jnp.full((8,), -3.0)
    >>> A_real = -0.5 * jnp.ones((8, 4)); A_imag = jnp.ones((8, 4))
    >>> B = C = jnp.ones((8, 4, 2))
    >>> y, s = chunk_s4d(u, log_dt, A_real, A_imag, B, C,
    ...                  output_final_state=True)
    >>> y.shape, s.shape
    ((2, 100, 8), (2, 8, 4, 2))
  """
  batch, length, channels, n_modes = validate(
      u, log_dt, A_real, A_imag, B, C, D, initial_state, segment_ids)
  checks.check_chunk_size(chunk_size)
  chunk = min(chunk_size, length)
  if segment_ids is not None:
    chunk = min(chunk, MASKED_CHUNK)
  n_chunks = -(-length // chunk)
  last = length - (n_chunks - 1) * chunk
  toeplitz, state_in, read_out, decay, last_in, last_decay = (
      _chunk_operators(log_dt, A_real, A_imag, B, C, chunk, last))
  uf = jnp.asarray(u, _F32)
  u_c = split_chunks(pad_time(uf, chunk), chunk)                # [B, M, L, D]
  if segment_ids is None:
    y = jnp.einsum("dts,bmsd->bmtd", toeplitz, u_c)             # [B, M, L, D]
    u_in, keep, out_mask = u_c, None, None
  else:
    doc = pad_time(document_index(segment_ids, batch, length), chunk,
                   mode="edge")
    doc = split_chunks(doc, chunk)                              # [B, M, L]
    # The document of the token before each chunk (the initial state's is
    # the first token's).
    before = jnp.concatenate([doc[:, :1, 0], doc[:, :-1, -1]], axis=1)
    same = doc[..., :, None] == doc[..., None, :]               # [B, M, L, L]
    y = jnp.einsum("dts,bmts,bmsd->bmtd", toeplitz, same.astype(_F32), u_c)
    u_in = u_c * (doc == doc[..., -1:])[..., None]              # last doc only
    keep = (doc[..., -1] == before).astype(_F32)                # [B, M]
    out_mask = (doc == before[..., None]).astype(_F32)          # [B, M, L]
  s = _as_complex(jnp.einsum("dns,bmsd->bmdn", state_in, u_in))  # [B,M,D,N]
  x0 = complex_state(initial_state, (batch, channels, n_modes))

  def across(x, inputs):
    s_m, keep_m = inputs                                        # [B, D, N]
    decay_m = decay if keep_m is None else decay * keep_m[:, None, None]
    return decay_m * x + s_m, x

  keeps = None if keep is None else jnp.moveaxis(keep, 1, 0)
  x_last, entering = jax.lax.scan(
      across, x0, (jnp.moveaxis(s[:, :-1], 1, 0),
                   None if keeps is None else keeps[:-1]))
  entering = jnp.concatenate([entering, x_last[None]], axis=0)  # [M, B, D, N]
  entering = _as_pair(jnp.moveaxis(entering, 0, 1))             # [B,M,D,2N]
  carried = jnp.einsum("dnt,bmdn->bmtd", read_out, entering)    # [B, M, L, D]
  if out_mask is not None:
    carried = carried * out_mask[..., None]
  y = merge_chunks(y + carried)[:, :length]
  if D is not None:
    y = y + jnp.asarray(D, _F32) * uf
  final = None
  if output_final_state:
    s_last = _as_complex(jnp.einsum("dns,bsd->bdn", last_in, u_in[:, -1]))
    decay_last = (last_decay if keep is None
                  else last_decay * keep[:, -1, None, None])
    final = to_pair(decay_last * x_last + s_last)
  return y.astype(u.dtype), final
