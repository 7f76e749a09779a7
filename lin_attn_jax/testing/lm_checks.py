"""The acceptance checks every mixer passes inside a small 2-layer LM.

- ``check_modes``: chunk, parallel and recurrent modes give the same logits;
- ``check_decoding``: two prefills and token-by-token decoding with the cache
  reproduce the logits of one full forward pass;
- ``check_gradients``: one backward pass reaches every parameter.

Each is run with and without packed documents (``SEGMENT_IDS`` puts document
boundaries inside a prefill, on the first token of the second prefill, and
during decoding). The shapes are tiny, so compiling dominates: each check is
one or two jitted programs, compiled without the expensive LLVM passes (the
float32 operations are the same).
"""

from __future__ import annotations

from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax.models.lm import LM, LMConfig
from lin_attn_jax.testing.errors import rel_rms

FAST_COMPILE = {"xla_backend_optimization_level": 0,
                "xla_llvm_disable_expensive_passes": True}
# float32 logits of two layers: the forms differ by reassociation only.
TOL = 1e-4
BATCH, LENGTH, PREFILL = 2, 24, 8
VOCAB = 61
SEGMENT_IDS = np.array(
    [[0] * 5 + [1] * 3 + [2] * 11 + [3] * 5,   # changes at 5, 8 (a call), 19
     [4] * 16 + [5] * 5 + [6] * 3],            # changes at 16 (a call), 21
    np.int32)


def tiny_lm(mixer, options=None, *, seed=0, **config) -> LM:
  """A 2-layer LM of width 32 and two heads with ``mixer`` in every layer."""
  options = {} if options is None else options
  names = (mixer,) if isinstance(mixer, str) else tuple(mixer)
  config = dict(dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2),
                **config)
  return LM(LMConfig(mixer=mixer, mixer_options={n: options for n in names},
                     **config), rngs=nnx.Rngs(seed))


def tokens(seed=1, length=LENGTH):
  return jnp.asarray(np.random.default_rng(seed).integers(
      0, VOCAB, (BATCH, length)), jnp.int32)


def segments(use: bool, length=LENGTH):
  return jnp.asarray(SEGMENT_IDS[:, :length]) if use else None


def _split(lm):
  graphdef, params, rest = nnx.split(lm, nnx.Param, ...)
  return graphdef, params, rest


def all_modes(lm, toks, segment_ids, modes=("chunk", "parallel", "recurrent")):
  """Logits of every mode, in one compiled program."""
  graphdef, params, rest = _split(lm)

  def run(params, rest, toks, segment_ids):
    model = nnx.merge(graphdef, params, rest)
    return {m: model(toks, segment_ids=segment_ids, mode=m) for m in modes}

  return jax.jit(run, compiler_options=FAST_COMPILE)(params, rest, toks,
                                                     segment_ids)



def mixer_modes_and_decoding(mixer, x, segment_ids, prefill: int = 3,
                             modes=("chunk", "parallel", "recurrent")):
  """A mixer's outputs in every mode, and from one prefill of ``prefill``
  tokens then one token a call with its cache: ``([y per mode], decoded)``,
  each ``[B, T, D]``. Traceable: call it inside one jitted program."""
  batch, length = x.shape[:2]
  outputs = [mixer(x, segment_ids=segment_ids, mode=m) for m in modes]
  cache = mixer.init_cache(batch, length)
  first, cache = mixer(x[:, :prefill], segment_ids=segment_ids[:, :prefill],
                       cache=cache)
  decoded = [first]
  for t in range(prefill, length):
    y, cache = mixer(x[:, t:t + 1], segment_ids=segment_ids[:, t:t + 1],
                     cache=cache)
    decoded.append(y)
  return outputs, jnp.concatenate(decoded, axis=1)

def check_modes(lm, *, use_segments: bool,
                modes=("chunk", "parallel", "recurrent"), tol=TOL):
  logits = all_modes(lm, tokens(), segments(use_segments), modes)
  for mode in modes:
    assert np.all(np.isfinite(logits[mode])), mode
  errors = {m: rel_rms(logits[m], logits[modes[0]]) for m in modes[1:]}
  assert all(e <= tol for e in errors.values()), errors
  return logits[modes[0]], errors


def decode_logits(lm, toks, segment_ids, prefill=PREFILL):
  """Logits from two prefills of ``prefill`` tokens, then one token a call."""
  graphdef, params, rest = _split(lm)
  cache = lm.init_cache(BATCH, toks.shape[1])

  def call(params, rest, cache, toks, segment_ids):
    model = nnx.merge(graphdef, params, rest)
    return model(toks, segment_ids=segment_ids, cache=cache)

  call = jax.jit(call, compiler_options=FAST_COMPILE)

  def piece(a, b):
    return toks[:, a:b], None if segment_ids is None else segment_ids[:, a:b]

  out = []
  for a in (0, prefill):
    logits, cache = call(params, rest, cache, *piece(a, a + prefill))
    out.append(logits)
  for t in range(2 * prefill, toks.shape[1]):
    logits, cache = call(params, rest, cache, *piece(t, t + 1))
    out.append(logits)
  return jnp.concatenate(out, axis=1), cache


def check_decoding(lm, *, use_segments: bool, reference=None, tol=TOL):
  """Prefill + decode against the chunk-mode forward (or ``reference``)."""
  toks, seg = tokens(), segments(use_segments)
  if reference is None:
    reference = all_modes(lm, toks, seg, ("chunk",))["chunk"]
  decoded, cache = decode_logits(lm, toks, seg)
  error = rel_rms(decoded, reference)
  assert error <= tol, error
  positions = [np.asarray(c["position"]) for c in cache]
  assert all(np.all(p == LENGTH) for p in positions), positions
  return error


def param_gradients(lm, *, use_segments: bool, mode: str = "chunk"):
  """Gradients of a random linear functional of the logits."""
  graphdef, params, rest = _split(lm)
  toks, seg = tokens(), segments(use_segments)
  cotangent = jnp.asarray(np.random.default_rng(2).normal(
      size=(BATCH, LENGTH, lm.config.vocab_size)), jnp.float32)

  def loss(params):
    model = nnx.merge(graphdef, params, rest)
    return jnp.sum(model(toks, segment_ids=seg, mode=mode) * cotangent)

  return jax.jit(jax.grad(loss), compiler_options=FAST_COMPILE)(params)


def zero_gradient_paths(grads) -> list[str]:
  """Paths of parameters whose gradient is all zero (or not finite)."""
  bad = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]:
    g = np.asarray(leaf)
    if not np.all(np.isfinite(g)) or not np.any(g != 0):
      bad.append(jax.tree_util.keystr(path))
  return bad


def check_gradients(lm, *, use_segments: bool,
                    allowed_zero: Iterable[str] = ()):
  """Every parameter gets a nonzero, finite gradient (``allowed_zero``:
  substrings of documented exceptions)."""
  bad = [p for p in zero_gradient_paths(
      param_gradients(lm, use_segments=use_segments))
         if not any(a in p for a in allowed_zero)]
  assert not bad, f"parameters with zero or non-finite gradients: {bad}"


def check_mixer(lm, *, use_segments: bool, allowed_zero=()):
  """All three checks for ``lm`` (a ``tiny_lm``): modes, decoding, gradients."""
  reference, _ = check_modes(lm, use_segments=use_segments)
  check_decoding(lm, use_segments=use_segments, reference=reference)
  check_gradients(lm, use_segments=use_segments, allowed_zero=allowed_zero)
