"""The contract every token mixer keeps, and the bookkeeping they share.

A mixer maps ``x: [B, T, D]`` to ``y: [B, T, D]``::

    y = mixer(x, segment_ids=None, mode="chunk")            # training
    y, cache = mixer(x, cache=mixer.init_cache(B, max_len))  # prefill / decode

``mode`` picks the op form: ``"chunk"`` (the training path), ``"parallel"``
(the quadratic masked form) or ``"recurrent"`` (token by token); the three
agree to float tolerance. With a cache, a call of ``T > 1`` tokens runs the
chosen form from the cached state (prefill), and a call of one token runs the
op's step form (decoding, O(1) per token for recurrent mixers).

A cache is a dict (a pytree) with two entries kept here and one kept by the
mixer:

- ``"position"``: ``[B]`` int32, tokens seen so far;
- ``"segment_id"``: ``[B]`` int32, the document id of the last token seen, so
  that a call whose first token starts a new document drops the state;
- ``"mixer"``: what the mixer needs to continue (recurrent states, the last
  inputs of its short convolutions, a KV buffer), from ``init_mixer_cache``.

Subclasses implement ``mix(x, ctx)`` and ``init_mixer_cache``; non-causal
mixers set ``causal = False`` and refuse a cache and the recurrent mode.
A mixer whose op has non-causal forms takes ``causal: bool = True`` in its
constructor (``set_causal``): with False the instance's ``causal`` is False
(the same refusals), and ``apply_forms`` runs the op's forms with
``causal=False`` (every token reads its whole document, both ways; the
recurrences as LION defines them, ``lin_attn_jax/ops/common/bidirectional.py``).
Short convolutions stay causal (a local mixing of the last few tokens). A
mixer names its op's forms once (``OpForms``) and runs them through
``Mixer.apply_forms``, which picks the decoding step or the form of the mode
and threads the cached state, so that ``mix`` reads as the layer's
equations.

``mixer.state_size(seq_len)`` is the number of floats a mixer carries from
one token to the next, per layer and per sequence, after ``seq_len`` tokens:
what it can remember. Attention counts its KV cache at that length
(``2 x T x H_kv x head_dim``), a sliding window its window (``2 x min(w, T) x
...``), a recurrent mixer its recurrent state (``H x K x V`` for a matrix
state, ``E x N`` for Mamba). Short-convolution buffers and token shifts (the
last few inputs, a fixed window of ``width - 1`` tokens, not a memory of the
past) are left out, as in the papers' counts; ``include_conv=True`` adds
them, and then the count equals the floats of ``init_mixer_cache`` (less the
KV caches' bookkeeping). Each mixer implements ``recurrent_state_floats`` and,
where it has convolution buffers, ``conv_state_floats``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.ops.common import checks, dispatch

MODES = ("chunk", "parallel", "recurrent")


@dataclasses.dataclass(frozen=True)
class Context:
  """What a mixer's ``mix`` needs beyond ``x`` (built by ``Mixer.__call__``).

  Attributes:
    mode: ``"chunk"``, ``"parallel"`` or ``"recurrent"``.
    segment_ids: ``[B, T]`` int32 or None.
    positions: ``[B, T]`` int32 absolute positions (after the cached tokens).
    cache: the mixer's part of the cache, or None when there is no cache.
    restart: ``[B]`` bool or None, True where the first token starts a new
      document, so that the cached state must not carry into it.
    carry: a dict passed from layer to layer by the LM (``Mixer.run``), or
      None; RWKV-7's first layer writes its values there and later layers
      read them (value residual).
  """
  mode: str
  segment_ids: Any
  positions: Any
  cache: Any = None
  restart: Any = None
  carry: Any = None

  def starts(self):
    """``[B, T]`` bool: True at the first token of every document (absolute
    position 0, a change of segment id, or a restarted cached call)."""
    b, t = self.positions.shape
    first = self.positions == 0
    if self.segment_ids is not None:
      first = first | jnp.concatenate(
          [jnp.zeros((b, 1), bool),
           self.segment_ids[:, 1:] != self.segment_ids[:, :-1]], axis=1)
    if self.restart is not None:
      first = first.at[:, 0].set(first[:, 0] | self.restart)
    return first

  @property
  def decoding(self) -> bool:
    """True for a one-token call with a cache: use the step forms."""
    return self.cache is not None and self.positions.shape[1] == 1

  def carried(self, state):
    """``state`` (a pytree, leading axis B) zeroed where ``restart``."""
    if state is None or self.restart is None:
      return state

    def keep(x):
      mask = self.restart.reshape((-1,) + (1,) * (x.ndim - 1))
      return jnp.where(mask, jnp.zeros_like(x), x)

    return jax.tree.map(keep, state)

  def repeated(self, n: int) -> "Context":
    """This context for a batch whose row ``b`` is repeated ``n`` times
    (row ``b n + j`` is row ``b``), as ``jnp.repeat(x, n, axis=0)``."""

    def rows(x):
      return None if x is None else jnp.repeat(x, n, axis=0)

    return dataclasses.replace(self, segment_ids=rows(self.segment_ids),
                               positions=rows(self.positions),
                               restart=rows(self.restart))


@dataclasses.dataclass(frozen=True)
class OpForms:
  """The forms of one op, as a mixer calls them.

  ``chunk``, ``parallel`` and ``recurrent`` take ``[B, T, ...]`` inputs and
  ``initial_state``, ``output_final_state`` and ``segment_ids``; ``step``
  takes one token's inputs (``[B, ...]``), ``state`` and ``reset``. All four
  take the op's other arguments under the same names.
  """
  chunk: Callable
  parallel: Callable
  recurrent: Callable
  step: Callable


def run_forms(ctx: Context, forms: OpForms, tokens: dict, state=None, *,
              chunk_options: dict | None = None, **params):
  """The op of ``ctx``: its step when decoding, else the form of
  ``ctx.mode``, run from ``state`` (zeroed where ``ctx.restart``).

  Args:
    ctx: the mixer's ``Context``.
    forms: the op's ``OpForms``.
    tokens: the per-token inputs by argument name, ``[B, T, ...]`` arrays
      (or None); a decoding step reads token 0 of each.
    state: the cached state, or None without a cache (then no final state
      is made).
    chunk_options: arguments of the chunk form alone (``chunk_size``,
      ``impl``).
    **params: the op's other arguments (parameters, options), passed as
      they are to every form.

  Returns:
    ``(o [B, T, ...], final state or None)``.
  """
  if ctx.decoding:
    token = {name: None if x is None else x[:, 0]
             for name, x in tokens.items()}
    o, state = forms.step(**token, **params, state=state, reset=ctx.restart)
    return o[:, None], state
  form = {"chunk": functools.partial(forms.chunk, **(chunk_options or {})),
          "parallel": forms.parallel,
          "recurrent": forms.recurrent}[ctx.mode]
  return form(**tokens, **params, initial_state=ctx.carried(state),
              output_final_state=state is not None,
              segment_ids=ctx.segment_ids)


def zero_state(batch_size: int, heads: int, dim_k: int, dim_v: int):
  """An empty matrix state ``[B, H, K, V]``, float32 whatever the dtype."""
  return jnp.zeros((batch_size, heads, dim_k, dim_v), jnp.float32)


def checked_impl(impl: str) -> str:
  """``impl`` of a mixer, validated: ``"auto"``, ``"xla"`` or ``"pallas"``."""
  dispatch.check_impl(impl)
  return impl


# The chunk length of the layers on CPU when a mixer's ``chunk_size`` is
# None (``resolved_chunk_size``).
CPU_CHUNK_SIZE = 16


def resolved_chunk_size(chunk_size: int | None) -> int:
  """A mixer's ``chunk_size``, ``None`` meaning the backend's default:
  ``CPU_CHUNK_SIZE`` on CPU (shorter chunks compile and train faster there,
  see docs/performance.md), 64 on TPU/GPU (the kernels' tiles)."""
  if chunk_size is not None:
    return chunk_size
  return CPU_CHUNK_SIZE if jax.default_backend() == "cpu" else 64


def check_mode(mode) -> None:
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


class Mixer(nnx.Module):
  """Base class of the token mixers in ``lin_attn_jax.layers``."""

  causal: bool = True
  # Whether ``segment_ids`` may be given (False: one document per row, and
  # padding is read as tokens; Linformer's projections sum over the row).
  segments: bool = True
  # Chunk length of the chunk forms (None: ``resolved_chunk_size``) and
  # the chunk forms' ``impl`` (None for ops that have one implementation).
  chunk_size: int | None = None
  impl: str | None = None
  # Parameters (attribute names, dotted for submodules) that are decays,
  # gates or SSM dynamics rather than weights: the optimizer's weight decay
  # leaves them alone (``train.optim.weight_decay_mask``).
  no_weight_decay: tuple[str, ...] = ()
  # The short convolutions of q, k and v (``modules.QKVShortConv``), or
  # None. With them, the mixer cache is ``{"conv": their windows, "state":
  # the mixer's own cache}`` (``with_conv_cache``, ``split_cache``).
  short_conv = None

  def set_causal(self, causal: bool) -> None:
    """The constructor option ``causal``: False makes this instance
    non-causal (its ``causal`` attribute False: no cache, no recurrent
    mode, ``apply_forms`` passes ``causal=False`` to the op's forms)."""
    if not isinstance(causal, bool):
      raise ValueError(f"causal must be a bool, got {causal!r}")
    self.causal = causal

  def init_mixer_cache(self, batch_size: int, max_len: int, dtype):
    raise NotImplementedError

  def with_conv_cache(self, batch_size: int, cache):
    """``cache``, the mixer's own, with the empty windows of
    ``short_conv`` beside it (``cache`` itself without short
    convolutions)."""
    if self.short_conv is None:
      return cache
    return {"conv": self.short_conv.init_state(batch_size), "state": cache}

  def split_cache(self, ctx: Context):
    """``(windows of short_conv, the mixer's own cache)`` of ``ctx.cache``;
    None for what there is not."""
    if self.short_conv is None or ctx.cache is None:
      return None, ctx.cache
    return ctx.cache["conv"], ctx.cache["state"]

  def short_convolved(self, q, k, v, ctx: Context):
    """``((q, k, v), windows, own cache)``: the projections ``[B, T, C]``
    through ``short_conv`` when the mixer has one (else as they are), the
    convolutions' new windows and the mixer's own part of ``ctx.cache``
    (``split_cache``; None for what there is not)."""
    conv, cache = self.split_cache(ctx)
    if self.short_conv is not None:
      (q, k, v), conv = self.short_conv(q, k, v, ctx, conv)
    return (q, k, v), conv, cache

  def joined_cache(self, conv, cache):
    """The inverse of ``split_cache``: the new mixer cache from the new
    windows and the mixer's own new cache (None without a cache)."""
    if self.short_conv is None or cache is None:
      return cache
    return {"conv": conv, "state": cache}

  def recurrent_state_floats(self, seq_len: int) -> int:
    """Floats of the recurrent state (or KV cache) after ``seq_len`` tokens,
    per sequence; see ``state_size``."""
    raise NotImplementedError

  def conv_state_floats(self) -> int:
    """Floats of the short-convolution buffers and token shifts, per
    sequence (0 for none): those of ``short_conv`` here."""
    return 0 if self.short_conv is None else self.short_conv.state_floats()

  def state_size(self, seq_len: int, *, include_conv: bool = False) -> int:
    """Floats this mixer carries between tokens, per layer and per sequence,
    after ``seq_len`` tokens (see the module docstring).

    Args:
      seq_len: ``T``, the tokens seen (the length of a KV cache; a recurrent
        state does not depend on it).
      include_conv: also count the short-convolution buffers and token
        shifts.

    Raises:
      ValueError: ``seq_len`` is not a positive int, or the mixer is not
        causal (it has no state: every token sees the whole sequence).
    """
    checks.positive_int("seq_len", seq_len)
    if not self.causal:
      raise ValueError(f"{type(self).__name__} is not causal: it carries no "
                       "state from token to token")
    size = self.recurrent_state_floats(seq_len)
    if include_conv:
      size += self.conv_state_floats()
    return int(size)

  def mix(self, x, ctx: Context):
    """Returns ``(y [B, T, D], new mixer cache or None)``, or ``(y, cache,
    carry)`` for a mixer that passes something on to later layers."""
    raise NotImplementedError

  def chunk_options(self) -> dict:
    """The chunk forms' ``chunk_size`` (resolved) and ``impl`` (where the
    mixer has one)."""
    options = {"chunk_size": resolved_chunk_size(self.chunk_size)}
    if self.impl is not None:
      options["impl"] = self.impl
    return options

  def apply_forms(self, ctx: Context, forms: OpForms, tokens: dict,
                  state=None, **params):
    """``forms`` as ``ctx`` asks: the step when decoding, else the form of
    ``ctx.mode`` with this mixer's ``chunk_options`` (see ``run_forms``).

    Returns ``(o [B, T, ...], final state or None)``; a non-causal mixer
    runs the forms with ``causal=False``.
    """
    if not self.causal:
      params = {**params, "causal": False}
    return run_forms(ctx, forms, tokens, state,
                     chunk_options=self.chunk_options(), **params)

  def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32):
    """An empty cache for ``batch_size`` rows of up to ``max_len`` tokens.

    ``dtype`` is that of stored keys and values; recurrent states are
    float32 whatever it is. Non-causal mixers raise ``ValueError``.
    """
    if not self.causal:
      raise ValueError(f"{type(self).__name__} is not causal: it has no "
                       "cache and cannot decode token by token")
    checks.positive_int("batch_size", batch_size)
    checks.positive_int("max_len", max_len)
    return {
        "position": jnp.zeros((batch_size,), jnp.int32),
        "segment_id": jnp.zeros((batch_size,), jnp.int32),
        "mixer": self.init_mixer_cache(batch_size, max_len, dtype),
    }

  def __call__(self, x, *, segment_ids=None, mode: str = "chunk", cache=None):
    """Mixes ``x: [B, T, D]``; returns ``y`` or ``(y, cache)``.

    Args:
      x: ``[B, T, D]`` float.
      segment_ids: ``[B, T]`` int, packed documents; no information crosses
        a change of id, in every mode and across cached calls.
      mode: ``"chunk"``, ``"parallel"`` or ``"recurrent"``.
      cache: from ``init_cache`` or a previous call; then the result is
        ``(y, new cache)``.
    """
    y, new_cache, _ = self.run(x, segment_ids=segment_ids, mode=mode,
                               cache=cache)
    return y if cache is None else (y, new_cache)

  def run(self, x, *, segment_ids=None, mode: str = "chunk", cache=None,
          carry=None):
    """``__call__`` with a ``carry`` dict passed between layers: returns
    ``(y, new cache or None, carry)`` (see ``Context.carry``)."""
    check_mode(mode)
    checks.check_rank("x", x, 3, "[B, T, D]")
    checks.check_float("x", x)
    b, t, _ = checks.shape_of(x)
    if segment_ids is not None:
      checks.check_segment_ids(segment_ids, b, t)
      segment_ids = jnp.asarray(segment_ids, jnp.int32)
    if not self.causal and (cache is not None or mode == "recurrent"):
      raise ValueError(
          f"{type(self).__name__} is not causal (every token sees the whole "
          "sequence): it has no cache and no recurrent mode")
    steps = jnp.arange(t, dtype=jnp.int32)[None]
    if cache is None:
      ctx = Context(mode, segment_ids, jnp.broadcast_to(steps, (b, t)),
                    carry=carry)
      out = self.mix(x, ctx)
      return out[0], None, out[2] if len(out) == 3 else carry
    if not isinstance(cache, dict) or set(cache) != {"position", "segment_id",
                                                     "mixer"}:
      raise ValueError("cache must come from init_cache (a dict with "
                       "position, segment_id and mixer)")
    checks.check_shape("cache['position']", cache["position"], (b,), "[B]")
    restart = (None if segment_ids is None
               else segment_ids[:, 0] != cache["segment_id"])
    ctx = Context(mode, segment_ids, cache["position"][:, None] + steps,
                  cache["mixer"], restart, carry)
    out = self.mix(x, ctx)
    y, mixer_cache = out[0], out[1]
    new_cache = {
        "position": cache["position"] + t,
        "segment_id": (cache["segment_id"] if segment_ids is None
                       else segment_ids[:, -1]),
        "mixer": mixer_cache,
    }
    return y, new_cache, out[2] if len(out) == 3 else carry


class MatrixStateMixer(Mixer):
  """A mixer whose cache is one matrix state ``[B, H, head_k, head_v]``
  (``self.n_heads``, ``self.head_k``, ``self.head_v``), with the windows of
  its ``short_conv`` when it has one."""

  def init_mixer_cache(self, batch_size: int, max_len: int, dtype):
    del max_len, dtype
    return self.with_conv_cache(batch_size, zero_state(
        batch_size, self.n_heads, self.head_k, self.head_v))

  def recurrent_state_floats(self, seq_len: int) -> int:
    del seq_len
    return self.n_heads * self.head_k * self.head_v
