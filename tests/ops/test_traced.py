"""Every op form and every mixer mode runs on traced arrays.

Two ways, for every form of every op spec (``lin_attn_jax.testing.op_calls``) and every mixer
in ``layers.MIXERS`` in every mode:

- traced: all arrays, parameters included, are arguments of a ``jax.jit``
  whose body runs a ``lax.scan`` whose body takes ``jax.grad``: every array
  is a tracer;
- concrete: concrete arrays closed over inside a ``lax.scan`` body, where a
  ``jnp`` operation on them is traced (a value check must read them with
  NumPy, ``checks.concrete``).

A value check that turns a tracer into a Python bool fails while tracing,
so each case is traced (``jax.make_jaxpr``), not compiled. The traced
programs are also searched for primitives that become LAPACK or FFT custom
calls on CPU, which can deadlock XLA's intra-op thread pool.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import MIXERS, MODES
from lin_attn_jax.testing import (check_custom_calls, concrete_arrays,
                                  is_float, op_calls, traced_closed_over,
                                  traced_grads)

def _total(tree):
  return sum(jnp.sum(jnp.asarray(leaf, jnp.float32))
             for leaf in jax.tree.leaves(tree) if is_float(leaf))


OP_CALLS = op_calls()
# The fast suite traces the chunk forms and the decoding steps (and
# prefills) of every op; the naive, parallel and recurrent forms run under
# jit and grad in every form check, and are traced here in the slow suite.
SLOW_FORMS = ("naive", "parallel", "recurrent")
OP_RUNS = [pytest.param(c, id=c.name, marks=pytest.mark.slow
                        if c.name.split(".")[-1] in SLOW_FORMS else ())
           for c in OP_CALLS]


@pytest.mark.parametrize("call", OP_RUNS)
def test_op_traced(call):
  floats = {n: x for n, x in call.arrays.items()
            if all(is_float(leaf) for leaf in jax.tree.leaves(x))}
  others = {n: x for n, x in call.arrays.items() if n not in floats}
  jaxpr = traced_grads(lambda f, o: _total(call.run({**f, **o})), floats,
                       others)
  check_custom_calls(call.name, jaxpr)


@pytest.mark.parametrize("call", OP_RUNS)
def test_op_concrete_inside_trace(call):
  arrays = concrete_arrays(call.arrays)
  traced_closed_over(lambda: call.run(arrays))


BATCH, LENGTH, D_MODEL, HEADS = 2, 5, 16, 2


@functools.lru_cache(maxsize=None)
def _abstract_mixer(name, short_conv=False):
  """``(graphdef, params, rest)`` of the mixer, abstract (nothing runs);
  ``short_conv``: with ``use_short_conv=True``."""
  options = {"use_short_conv": True} if short_conv else {}
  model = nnx.eval_shape(lambda: MIXERS[name](D_MODEL, HEADS,
                                              rngs=nnx.Rngs(0), **options))
  return nnx.split(model, nnx.Param, ...)


def _inputs(name):
  """``x`` and segment ids (none for a mixer that is not causal)."""
  x = jnp.asarray(np.random.default_rng(0).normal(
      size=(BATCH, LENGTH, D_MODEL)), jnp.float32)
  if not MIXERS[name].causal:
    return x, None
  return x, jnp.asarray([[0, 0, 1, 1, 1], [0, 0, 0, 2, 2]], jnp.int32)


def _run_mode(model, mode, x, segment_ids):
  """``y`` of ``mode``; ``"cache"``: a prefill of all but the last token
  from an empty cache, then one decoding step."""
  if mode != "cache":
    return model(x, segment_ids=segment_ids, mode=mode)
  cache = model.init_cache(BATCH, LENGTH)
  y, cache = model(x[:, :-1], segment_ids=segment_ids[:, :-1], cache=cache)
  y_last, _ = model(x[:, -1:], segment_ids=segment_ids[:, -1:], cache=cache)
  return jnp.concatenate([y, y_last], axis=1)


MIXER_CASES = [(name, mode) for name in sorted(MIXERS)
               for mode in MODES + ("cache",)
               if MIXERS[name].causal or mode in ("chunk", "parallel")]
# The fast suite traces every mixer in chunk mode and with a cache (prefill
# and one step: the step form); the parallel and recurrent modes call op
# forms that test_op_traced traces with every array traced, so the mixers'
# runs of them are in the slow suite.
MIXER_RUNS = [pytest.param(name, mode, id=f"{name}.{mode}",
                           marks=pytest.mark.slow
                           if mode in ("parallel", "recurrent")
                           and MIXERS[name].causal else ())
              for name, mode in MIXER_CASES]


@pytest.mark.parametrize("name, mode", MIXER_RUNS)
def test_mixer_traced(name, mode):
  _check_mixer_traced(name, mode)


def _check_mixer_traced(name, mode, short_conv=False):
  """The gradient of the mixer's output in ``mode`` with every parameter
  and input traced, and no custom call in its program."""
  graphdef, params, rest = _abstract_mixer(name, short_conv)

  def loss(params, other):
    rest, x, segment_ids = other
    model = nnx.merge(graphdef, params, rest)
    return _total(_run_mode(model, mode, x, segment_ids))

  jaxpr = traced_grads(loss, params, (rest,) + _inputs(name))
  check_custom_calls(f"{name}.{mode}" + ("+short_conv" if short_conv
                                        else ""), jaxpr)


# The mixers whose ``use_short_conv`` is off by default (the parallel and
# recurrent modes in the slow suite, as above).
SHORT_CONV_CASES = [pytest.param(name, mode, id=f"{name}.{mode}",
                                 marks=pytest.mark.slow
                                 if mode in ("parallel", "recurrent") else ())
                    for name in ("based", "forgetting_attn", "gla", "hgrn2",
                                 "linear_attn", "retnet")
                    for mode in MODES + ("cache",)]


@pytest.mark.parametrize("name, mode", SHORT_CONV_CASES)
def test_short_conv_mixer_traced(name, mode):
  _check_mixer_traced(name, mode, short_conv=True)


@pytest.mark.parametrize("name, mode", MIXER_RUNS)
def test_mixer_concrete_inside_trace(name, mode):
  graphdef, params, rest = _abstract_mixer(name)
  model = nnx.merge(graphdef, concrete_arrays(params), concrete_arrays(rest))
  x, segment_ids = _inputs(name)
  traced_closed_over(lambda: _run_mode(model, mode, x, segment_ids))


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_mixer_init_has_no_custom_calls(name):
  """Building a mixer (e.g. Performer's orthogonal random features) calls
  no LAPACK either: models are often built inside a jit."""
  def build():
    return nnx.state(MIXERS[name](D_MODEL, HEADS, rngs=nnx.Rngs(0)))
  check_custom_calls(f"{name}.init", jax.make_jaxpr(build)())
