"""The MQAR generator: structure, the power law of the gaps, determinism."""

import numpy as np
import pytest

from lin_attn_jax.data import mqar
from lin_attn_jax.data.mqar import IGNORE_INDEX

V, T, P = 64, 40, 5


def _examples(n=200, **kw):
  args = dict(vocab_size=V, seq_len=T, num_kv_pairs=P, seed=3)
  args.update(kw)
  return mqar.mqar_examples(n, **args)


@pytest.mark.parametrize("random_non_queries", [True, False])
def test_structure(random_non_queries):
  inputs, targets = _examples(random_non_queries=random_non_queries)
  assert inputs.shape == targets.shape == (200, T)
  assert inputs.dtype == targets.dtype == np.int32
  assert inputs.min() >= 0 and inputs.max() < V
  keys, values = inputs[:, 0:2 * P:2], inputs[:, 1:2 * P:2]
  # Keys and values come from disjoint halves, distinct within a row.
  assert keys.min() >= 1 and keys.max() < V // 2
  assert values.min() >= V // 2 and values.max() < V
  for row in range(len(inputs)):
    assert len(set(keys[row])) == P and len(set(values[row])) == P
  # The pairs are never targets; every key is queried once, after the pairs,
  # on a position 2P + 2g, and the target there is its value.
  assert (targets[:, :2 * P] == IGNORE_INDEX).all()
  queried = targets != IGNORE_INDEX
  assert (queried.sum(axis=1) == P).all()
  rows, pos = np.nonzero(queried)
  assert ((pos - 2 * P) % 2 == 0).all()
  for row, t in zip(rows, pos):
    j = list(keys[row]).index(inputs[row, t])
    assert targets[row, t] == values[row, j]
  # Filler tokens: uniform over the vocabulary, or zeros.
  filler = ~queried
  filler[:, :2 * P] = False
  if random_non_queries:
    assert len(np.unique(inputs[filler])) > V // 2
  else:
    assert (inputs[filler] == 0).all()


def test_gaps_follow_the_power_law():
  # With one pair the gap of its query is a single draw from the law.
  space = (T - 2) // 2
  for power_a in (0.3, 1.0):
    _, targets = _examples(20000, num_kv_pairs=1, power_a=power_a)
    gap = (np.nonzero(targets != IGNORE_INDEX)[1] - 2) // 2
    freq = np.bincount(gap, minlength=space) / len(gap)
    expected = mqar.gap_probabilities(space, power_a)
    # Binomial standard error of a frequency is at most 0.0035 here.
    np.testing.assert_allclose(freq, expected, atol=0.015)
  np.testing.assert_allclose(mqar.gap_probabilities(4, 1.0), 0.25)


def test_small_power_puts_queries_early():
  _, early = _examples(2000, power_a=0.01)
  _, uniform = _examples(2000, power_a=1.0)
  pos = lambda t: np.nonzero(t != IGNORE_INDEX)[1].mean()  # noqa: E731
  assert pos(early) < pos(uniform) - 3


def test_deterministic():
  a, b = _examples(seed=7), _examples(seed=7)
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  c = _examples(seed=8)
  assert not np.array_equal(a[0], c[0])
  kw = dict(vocab_size=V, seq_len=T, num_kv_pairs=P)
  s1 = mqar.train_test_split(50, 20, seed=1, **kw)
  s2 = mqar.train_test_split(50, 20, seed=1, **kw)
  for name in ("train_inputs", "train_targets", "test_inputs",
               "test_targets"):
    np.testing.assert_array_equal(getattr(s1, name), getattr(s2, name))
  assert s1.train_inputs.shape == (50, T) and s1.test_inputs.shape == (20, T)
  assert not np.array_equal(s1.train_inputs[:20], s1.test_inputs)


def test_accuracy():
  _, targets = _examples(10)
  assert mqar.accuracy(targets, targets) == 1.0
  assert mqar.accuracy(np.zeros_like(targets), targets) == 0.0


@pytest.mark.parametrize("kw, match", [
    (dict(seq_len=41), "even"),
    (dict(seq_len=18), "4 \\* num_kv_pairs"),
    (dict(vocab_size=10), "keys"),
    (dict(power_a=0.0), "power_a"),
    (dict(num_kv_pairs=0), "num_kv_pairs"),
])
def test_bad_arguments(kw, match):
  with pytest.raises(ValueError, match=match):
    _examples(**kw)
