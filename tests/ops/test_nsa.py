"""Native sparse attention: the definition against fla's naive code, and
the blockwise, decoding and prefill forms against the definition.

The forms are checked by ``lin_attn_jax.testing.check_forms`` (outputs and
the gradients of every input for random cotangents, under ``jit``, ``lax
.scan`` and ``grad``), at odd lengths, with several blocks and documents,
grouped heads, in float32 (relative RMS 1e-5) and bfloat16 (1e-2: the
inputs, outputs and gradients are rounded to bfloat16, everything inside
is float32). Normal queries and keys leave no near ties in the rankings,
so every form picks the same blocks.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops import registry
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.testing import rel_rms

FIXTURE = (pathlib.Path(__file__).parents[1] / "fixtures" / "ops"
           / "nsa.npz")
SPEC = registry.get_spec("nsa")
GATES = ("g_cmp", "g_slc", "g_swa")
# 37 tokens: 9 blocks of 4 and one short block, in chunks of 8 (one
# padded); 4 query heads on 2 key/value heads.
DIMS = registry.Dims(batch=2, length=37, heads=4, dim_k=8, dim_v=6)


def _inputs(seed, b, t, h, hkv, dk=8, dv=6, ids=True):
  rng = np.random.default_rng(seed)
  x = dict(q=rng.standard_normal((b, t, h, dk)),
           k=rng.standard_normal((b, t, hkv, dk)),
           v=rng.standard_normal((b, t, hkv, dv)))
  for gate in GATES:
    x[gate] = 1 / (1 + np.exp(-rng.standard_normal((b, t, h))))
  x = {n: jnp.asarray(a, jnp.float32) for n, a in x.items()}
  if ids:
    x["segment_ids"] = jnp.asarray(
        np.cumsum(rng.random((b, t)) < 0.08, axis=1), jnp.int32)
  return x


@pytest.mark.parametrize("dtype", [
    jnp.float32, pytest.param(jnp.bfloat16, marks=pytest.mark.slow)])
def test_forms_match_the_definition(dtype):
  errors = testing.check_forms(SPEC, dims=DIMS, chunk_size=8, dtype=dtype,
                               one_program=True)
  assert set(errors) == {"chunk", "step", "prefill"}


def _spec(**options):
  """The spec's chunk and prefill forms with other options."""
  counts = options["block_counts"]

  def prefill(q, k, v, g_cmp, g_slc, g_swa=None, segment_ids=None):
    cache = ops.init_nsa_cache(
        k.shape[0], k.shape[2], k.shape[3], v.shape[3], max_length=k.shape[1],
        block_size=options["block_size"], window_size=options["window_size"])
    return ops.nsa_extend(q, k, v, g_cmp, g_slc, g_swa, cache,
                          block_counts=counts, segment_ids=segment_ids,
                          scale=options.get("scale"), chunk_size=5)[0]

  forms = {"naive": registry.o_only(ops.parallel_nsa, **options),
           "chunk": registry.o_only(ops.chunk_nsa, "chunk_size", **options),
           "prefill": registry.o_only(prefill)}
  return dataclasses.replace(SPEC, forms=forms)


@pytest.mark.parametrize("options, heads, chunk_size", [
    # Multi-head (3 and 3), no window, more blocks asked than there are,
    # the default chunk.
    (dict(block_size=3, block_counts=20, window_size=None), (3, 3), None),
    # Blocks longer than the sequence: no compressed block, the selection
    # is the current block; one key/value head; a scale.
    (dict(block_size=64, block_counts=2, window_size=1, scale=0.3), (4, 1),
     7),
    # One block selected (the first: forced blocks rank by position).
    (dict(block_size=2, block_counts=1, window_size=4), (2, 1), 6),
])
def test_options(options, heads, chunk_size):
  inputs = _inputs(1, 2, 29, *heads)
  if options["window_size"] is None:
    inputs["g_swa"] = None
  testing.check_forms(_spec(**options), inputs=inputs, chunk_size=chunk_size,
                      one_program=True)


def test_definition_matches_fla_naive():
  """``fla.ops.nsa.naive.naive_nsa`` on CPU (made by ``python -m
  experiments.make_op_fixtures --only=nsa``): two rows with 2 groups of 16
  query heads, and one row of three documents (fla's ``cu_seqlens``)."""
  fixture = np.load(FIXTURE)
  for case in ("dense", "docs"):
    get = lambda name, case=case: fixture[f"{case}_{name}"]
    ids = (get("segment_ids") if f"{case}_segment_ids" in fixture.files
           else None)
    o = jax.jit(functools.partial(
        ops.parallel_nsa, block_size=int(get("block_size")),
        block_counts=int(get("block_counts")),
        window_size=int(get("window_size"))))(
            *(get(n) for n in ("q", "k", "v") + GATES), segment_ids=ids)
    assert rel_rms(o, get("o")) <= 1e-6, case


@functools.lru_cache(maxsize=None)
def _parallel(**options):
  return jax.jit(functools.partial(ops.parallel_nsa, **options))


def test_documents_are_independent():
  """A packed row gives every document what it gets alone: blocks restart
  at document starts, nothing crosses them."""
  options = dict(block_size=3, block_counts=3, window_size=5)
  x = _inputs(2, 1, 30, 2, 1, ids=False)
  ids = jnp.asarray([[0] * 7 + [1] * 14 + [2] * 9], jnp.int32)
  args = [x[n] for n in ("q", "k", "v") + GATES]
  packed = _parallel(**options)(*args, segment_ids=ids)
  for start, end in ((0, 7), (7, 21), (21, 30)):
    alone = _parallel(**options)(*(a[:, start:end] for a in args))
    assert rel_rms(packed[:, start:end], alone) <= 1e-6


def test_every_block_selected_is_causal_attention():
  """With every block selected and only the selected branch, NSA is causal
  softmax attention."""
  x = _inputs(3, 2, 23, 4, 2)
  zero, one = jnp.zeros_like(x["g_cmp"]), jnp.ones_like(x["g_slc"])
  o = _parallel(block_size=4, block_counts=6)(
      x["q"], x["k"], x["v"], zero, one, segment_ids=x["segment_ids"])
  expected = ops.parallel_softmax_attn(x["q"], x["k"], x["v"],
                                       segment_ids=x["segment_ids"])
  assert rel_rms(o, expected) <= 1e-6


def test_ranking_picks_the_likeliest_blocks():
  """One query head, one block ranked (block_counts = 4 with 3 forced):
  the selected branch attends to the block whose compressed key scores
  highest, among those before the previous block."""
  x = _inputs(4, 1, 24, 1, 1, ids=False)
  zero, one = jnp.zeros_like(x["g_cmp"]), jnp.ones_like(x["g_slc"])
  q, k, v = x["q"], x["k"], x["v"]
  o = _parallel(block_size=4, block_counts=4)(q, k, v, zero, one)
  i = 23                                   # block 5: forced 0, 4, 5
  means = k[0, :24, 0].reshape(6, 4, -1).mean(1)
  best = 1 + int(jnp.argmax(means[1:4] @ q[0, i, 0]))
  keys = np.r_[0:4, 4 * best:4 * best + 4, 16:24]
  s = k[0, keys, 0] @ q[0, i, 0] * 8 ** -0.5
  expected = jax.nn.softmax(s) @ v[0, keys, 0]
  assert rel_rms(o[0, i, 0], expected) <= 1e-6


def test_prefill_then_decode():
  """A prefill ending inside a block and a document, then one token at a
  time (a document starts at a step), reproduce the full forward; a
  bfloat16 cache too, within its rounding."""
  options = dict(block_size=4, block_counts=4, window_size=6)
  x = _inputs(5, 2, 26, 4, 2, ids=False)
  ids = jnp.asarray([[0] * 9 + [1] * 17, [0] * 20 + [1] * 6], jnp.int32)
  args = [x[n] for n in ("q", "k", "v") + GATES]
  expected = _parallel(**options)(*args, segment_ids=ids)
  split = 13

  @functools.partial(jax.jit, static_argnums=0)
  def decode(dtype, args, ids):
    cache = ops.init_nsa_cache(2, 2, 8, 6, max_length=32, block_size=4,
                               window_size=6, dtype=dtype)
    o_pre, cache = ops.nsa_extend(*(a[:, :split] for a in args), cache,
                                  block_counts=4, segment_ids=ids[:, :split],
                                  chunk_size=4)
    resets = reset_flags(ids, 2, 26)[:, split:]

    def step(cache, xs):
      *token, reset = xs
      o, cache = ops.nsa_step(*token, cache, block_counts=4, reset=reset)
      return cache, o

    tokens = [jnp.moveaxis(a[:, split:], 1, 0) for a in args]
    cache, o_steps = jax.lax.scan(step, cache, (*tokens, resets.T))
    return jnp.concatenate([o_pre, jnp.moveaxis(o_steps, 0, 1)], axis=1)

  assert rel_rms(decode(jnp.float32, args, ids), expected) <= 1e-6
  assert rel_rms(decode(jnp.bfloat16, args, ids), expected) <= 1e-2


def _largest_axes(jaxpr, length):
  """The most axes of size ``length`` any value in ``jaxpr`` (and its
  sub-jaxprs) has."""
  most = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      shape = getattr(var.aval, "shape", ())
      most = max(most, sum(d == length for d in shape))
    for value in eqn.params.values():
      subs = value if isinstance(value, (list, tuple)) else [value]
      for sub in subs:
        if isinstance(sub, jex.core.ClosedJaxpr):
          most = max(most, _largest_axes(sub.jaxpr, length))
        elif isinstance(sub, jex.core.Jaxpr):
          most = max(most, _largest_axes(sub, length))
  return most


def test_blockwise_form_never_forms_scores_of_all_pairs():
  """Forward and backward of the blockwise form hold no value with two
  axes of length T (the definition does)."""
  t = 1031
  x = _inputs(6, 1, t, 2, 1, ids=True)
  args = [x[n] for n in ("q", "k", "v") + GATES]
  options = dict(block_size=16, block_counts=4, window_size=40,
                 segment_ids=x["segment_ids"])

  def loss(form):
    return jax.grad(lambda *a: jnp.sum(form(*a, **options)),
                    argnums=tuple(range(6)))

  blockwise = jax.make_jaxpr(loss(functools.partial(ops.chunk_nsa,
                                                    chunk_size=32)))(*args)
  dense = jax.make_jaxpr(loss(ops.parallel_nsa))(*args)
  assert _largest_axes(blockwise.jaxpr, t) == 1
  assert _largest_axes(dense.jaxpr, t) >= 2


def test_bad_inputs_raise():
  x = _inputs(7, 1, 10, 4, 2, ids=False)
  q, k, v, g = x["q"], x["k"], x["v"], x["g_cmp"]
  for form in (ops.parallel_nsa, ops.chunk_nsa):
    with pytest.raises(ValueError, match=r"g_cmp must have shape \(1, 10, 4\)"):
      form(q, k, v, g[:, :, :2], g)
    with pytest.raises(ValueError, match="g_swa must be given"):
      form(q, k, v, g, g, window_size=4)
    with pytest.raises(ValueError, match="g_swa must be None without"):
      form(q, k, v, g, g, g)
    with pytest.raises(ValueError, match="block_counts must be a positive"):
      form(q, k, v, g, g, block_counts=0)
    with pytest.raises(ValueError, match="block_size must be a positive"):
      form(q, k, v, g, g, block_size=2.5)
    with pytest.raises(ValueError, match="heads of q"):
      form(q[:, :, :3], k, v, g[:, :, :3], g[:, :, :3])
  with pytest.raises(ValueError, match="chunk_size must be a positive"):
    ops.chunk_nsa(q, k, v, g, g, chunk_size=0)
  cache = ops.init_nsa_cache(1, 2, 8, 6, max_length=8, block_size=4)
  with pytest.raises(ValueError, match="cache is full"):
    ops.nsa_extend(q, k, v, g, g, None, cache)
  with pytest.raises(ValueError, match=r"k must have shape"):
    ops.nsa_step(q[:, 0], k[:, 0, :1], v[:, 0, :1], g[:, 0], g[:, 0], None,
                 cache)
  with pytest.raises(ValueError, match="g_swa must be None without"):
    ops.nsa_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], g[:, 0], g[:, 0], cache)
