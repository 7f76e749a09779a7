"""Gated DeltaProduct's arguments, their checks, and the op on the delta-rule
core.

A token carries ``N`` Householder sub-steps: ``k [B, T, N, H, K]``, ``v [B,
T, N, HV, V]`` and ``beta [B, T, N, HV]`` hold one key, value and step per
sub-step, ``q [B, T, H, K]`` and the log-decay ``g [B, T, HV]`` (or None) one
per token. On the core (``interleave``) the sub-steps become ``T N``
consecutive core tokens, token ``t``'s sub-step ``j`` at position ``t N + j``
(flash-linear-attention's ``(t n)`` order): the decay on sub-step 0, the
query on sub-step ``N - 1`` (zero elsewhere), the segment id repeated ``N``
times; the op's outputs are the core's at the last sub-steps
(``last_substeps``).
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks

_F32 = jnp.float32


def validate(q, k, v, g, beta, initial_state=None, segment_ids=None, *,
             step=False, state_name="initial_state"):
  """Checks a sequence call (``step=False``) or one decoding step.

  Returns:
    ``(lead, N, H, HV, K, V)``: ``lead`` is ``(B, T)`` (``(B,)`` for the
    step).
  """
  lead = ("B",) if step else ("B", "T")
  names = ", ".join(lead)
  layouts = (("q", q, f"[{names}, H, K]"), ("k", k, f"[{names}, N, H, K]"),
             ("v", v, f"[{names}, N, HV, V]"),
             ("beta", beta, f"[{names}, N, HV]"))
  if g is not None:
    layouts += (("g", g, f"[{names}, HV]"),)
  for name, x, layout in layouts:
    checks.check_rank(name, x, layout.count(",") + 1, layout)
    checks.check_float(name, x)
  qs, ks, vs = (checks.shape_of(x) for x in (q, k, v))
  r = len(lead)
  lead_shape, (h, dk) = qs[:r], qs[r:]
  n = ks[r]
  checks.check_shape("k", k, lead_shape + (n, h, dk), layouts[1][2])
  if n < 1:
    raise ValueError(f"k must hold at least one Householder step per token "
                     f"(N >= 1), got k of shape {ks}")
  if vs[:r + 1] != lead_shape + (n,):
    raise ValueError(f"v must agree with k on [{names}, N] = "
                     f"{lead_shape + (n,)}, got v of shape {vs}")
  hv, dv = vs[r + 1:]
  if hv % h:
    raise ValueError(f"v has HV={hv} heads, which must be a multiple of the "
                     f"H={h} heads of q and k (q {qs}, v {vs})")
  checks.check_shape("beta", beta, lead_shape + (n, hv), layouts[3][2])
  if g is not None:
    checks.check_shape("g", g, lead_shape + (hv,), layouts[4][2])
    checks.check_nonpositive("g", g)
  checks.check_state(state_name, initial_state, (lead_shape[0], hv, dk, dv),
                     "[B, HV, K, V]")
  if not step:
    checks.check_segment_ids(segment_ids, *lead_shape)
  return lead_shape, n, h, hv, dk, dv


def interleave(q, k, v, g, beta, segment_ids):
  """The core's ``(q, k, v, beta, g, segment_ids)`` over ``T N`` tokens.

  ``q [B, T, H, K] -> [B, T N, H, K]`` (zero but at sub-step ``N - 1``),
  ``k, v, beta`` merged ``[B, T, N, ...] -> [B, T N, ...]``, ``g [B, T, HV]
  -> [B, T N, HV]`` (zero but at sub-step 0; None stays None), the segment
  ids repeated ``N`` times.
  """
  b, t, n = checks.shape_of(k)[:3]

  def merged(x):                                               # [B, T N, ...]
    return jnp.reshape(x, (b, t * n) + x.shape[3:])

  def placed(x, j):                   # x [B, T, ...] at sub-step j of N
    x = jnp.asarray(x)
    pad = [(0, 0)] * (x.ndim + 1)
    pad[2] = (j, n - 1 - j)
    return merged(jnp.pad(x[:, :, None], pad))                 # [B, T N, ...]

  q_core = placed(q, n - 1)                                    # [B, T N, H, K]
  g_core = None if g is None else placed(g, 0)                 # [B, T N, HV]
  ids = (None if segment_ids is None
         else jnp.repeat(jnp.asarray(segment_ids), n, axis=1))  # [B, T N]
  return (q_core, merged(jnp.asarray(k)), merged(jnp.asarray(v)),
          merged(jnp.asarray(beta)), g_core, ids)


def last_substeps(o, n: int):
  """``o [B, T N, HV, V] -> [B, T, HV, V]``: the output of every token's last
  sub-step."""
  b, tn = o.shape[:2]
  return jnp.reshape(o, (b, tn // n, n) + o.shape[2:])[:, :, n - 1]


def on_core(core_form, q, k, v, g, beta, *, segment_ids=None, **options):
  """``core_form`` (a sequence form of the delta-rule core) run on the
  interleaved sub-steps; returns ``(o [B, T, HV, V], final state or
  None)``. The caller has validated the arguments."""
  n = checks.shape_of(k)[2]
  q, k, v, beta, g, ids = interleave(q, k, v, g, beta, segment_ids)
  o, state = core_form(q, k, v, beta, g, segment_ids=ids, **options)
  return last_substeps(o, n), state
