"""Multi-query associative recall (MQAR), as defined by Zoology.

Arora, Eyuboglu et al. 2023, "Zoology: Measuring and Improving Recall in
Efficient Language Models", https://arxiv.org/abs/2312.04927 (the
``multiquery_ar`` generator of its code). An example of ``seq_len`` tokens
(``P = num_kv_pairs``, vocabulary ``V``):

- positions ``0 .. 2P - 1``: ``P`` key-value pairs ``k_0 v_0 k_1 v_1 ...``,
  the keys distinct and drawn from ``[1, V / 2)``, the values distinct and
  drawn from ``[V / 2, V)`` (disjoint halves of the vocabulary);
- after them, every key is queried once: key ``k_j`` is placed at position
  ``2P + 2 g_j``, where the gaps ``g_j`` are distinct and drawn without
  replacement from ``[0, (seq_len - 2P) / 2)`` with probability proportional
  to ``(g + 1) ** (power_a - 1)`` (a power law: small ``power_a`` puts most
  queries soon after the pairs; ``power_a = 1`` is uniform);
- every other position holds a token drawn uniformly from ``[0, V)``
  (``random_non_queries=True``) or 0.

The target at a query position is the value paired with the queried key
(the model must emit it as its next-token prediction there); every other
target is ``IGNORE_INDEX`` (-100), to be left out of loss and accuracy.

Everything is numpy and a pure function of its arguments: the same seed
gives the same arrays. ``train_test_split`` draws the train and test sets
from two independent streams spawned from one seed.

Example:
  >>> inputs, targets = mqar_examples(4, vocab_size=64, seq_len=32,
  ...                                 num_kv_pairs=4, seed=0)
  >>> inputs.shape, targets.shape, int((targets != IGNORE_INDEX).sum())
  ((4, 32), (4, 32), 16)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lin_attn_jax.ops.common import checks

IGNORE_INDEX = -100

# Rows handled at once when drawing without replacement (bounds the
# temporary [rows, choices] array).
_BLOCK_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True)
class MQARData:
  """Train and test sets: ``inputs`` int32 ``[N, seq_len]`` token ids and
  ``targets`` int32 ``[N, seq_len]`` (``IGNORE_INDEX`` where not a query)."""

  train_inputs: np.ndarray
  train_targets: np.ndarray
  test_inputs: np.ndarray
  test_targets: np.ndarray


def check_arguments(vocab_size: int, seq_len: int, num_kv_pairs: int,
                    power_a: float) -> None:
  """Raises ``ValueError`` for arguments that admit no MQAR example."""
  for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len),
                      ("num_kv_pairs", num_kv_pairs)):
    checks.positive_int(name, value)
  if seq_len % 2:
    raise ValueError(f"seq_len must be even (queries sit on every other "
                     f"position), got {seq_len}")
  if 4 * num_kv_pairs > seq_len:
    raise ValueError(f"seq_len = {seq_len} must be at least 4 * num_kv_pairs "
                     f"= {4 * num_kv_pairs} (the pairs, then room for one "
                     f"query per key on every other position)")
  if num_kv_pairs > vocab_size // 2 - 1:
    raise ValueError(f"vocab_size = {vocab_size} has {vocab_size // 2 - 1} "
                     f"keys ([1, vocab_size / 2)), fewer than num_kv_pairs = "
                     f"{num_kv_pairs}")
  if not power_a > 0:
    raise ValueError(f"power_a must be > 0, got {power_a!r}")


def _choose_without_replacement(rng: np.random.Generator, rows: int,
                                choices: int, size: int, weights=None):
  """``[rows, size]`` int: per row, ``size`` distinct indices of
  ``[0, choices)``, drawn one after another with probability proportional to
  ``weights`` among those left (uniform if None).

  Exponential-keys sampling (Efraimidis & Spirakis 2006): the ``size``
  smallest of ``E_i / w_i``, ``E_i`` standard exponential, follow exactly
  that sequential law.
  """
  block = max(1, _BLOCK_ELEMENTS // choices)
  out = []
  for start in range(0, rows, block):
    keys = rng.standard_exponential((min(block, rows - start), choices))
    if weights is not None:
      keys = keys / weights
    part = np.argpartition(keys, size - 1, axis=1)[:, :size]
    order = np.argsort(np.take_along_axis(keys, part, axis=1), axis=1)
    out.append(np.take_along_axis(part, order, axis=1))
  return np.concatenate(out, axis=0)


def gap_probabilities(space: int, power_a: float) -> np.ndarray:
  """``[space]``: the power law ``p(g) ~ (g + 1) ** (power_a - 1)`` of a
  query's gap ``g`` (in pairs of positions) after the key-value pairs."""
  p = np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1.0)
  return p / p.sum()


def mqar_examples(num_examples: int, *, vocab_size: int = 8192,
                  seq_len: int = 64, num_kv_pairs: int = 4,
                  power_a: float = 0.01, random_non_queries: bool = True,
                  seed: int | np.random.SeedSequence = 0):
  """``num_examples`` MQAR sequences (see the module docstring).

  Args:
    num_examples: rows to draw.
    vocab_size: ``V``; keys come from ``[1, V / 2)``, values from
      ``[V / 2, V)``.
    seq_len: tokens per example, even, at least ``4 * num_kv_pairs``.
    num_kv_pairs: ``P``, key-value pairs per example; each is queried once.
    power_a: exponent of the power law of the query gaps (0.01 as in
      Zoology: queries mostly soon after the pairs; 1.0 is uniform).
    random_non_queries: fill the positions that are neither pairs nor
      queries with uniform random tokens (True) or with 0.
    seed: an int or a ``np.random.SeedSequence``.

  Returns:
    ``(inputs, targets)``, int32 ``[num_examples, seq_len]`` each; targets
    are the queried keys' values at the query positions and
    ``IGNORE_INDEX`` elsewhere.
  """
  check_arguments(vocab_size, seq_len, num_kv_pairs, power_a)
  if not isinstance(num_examples, (int, np.integer)) or num_examples < 0:
    raise ValueError(f"num_examples must be an int >= 0, got "
                     f"{num_examples!r}")
  rng = np.random.default_rng(seed)
  n, p = int(num_examples), num_kv_pairs
  half = vocab_size // 2
  keys = 1 + _choose_without_replacement(rng, n, half - 1, p)      # [N, P]
  values = half + _choose_without_replacement(rng, n, vocab_size - half, p)
  context = 2 * p
  space = (seq_len - context) // 2
  gaps = _choose_without_replacement(rng, n, space, p,
                                     gap_probabilities(space, power_a))
  query_pos = context + 2 * gaps                                   # [N, P]
  if random_non_queries:
    inputs = rng.integers(0, vocab_size, (n, seq_len), dtype=np.int64)
  else:
    inputs = np.zeros((n, seq_len), np.int64)
  inputs[:, 0:context:2] = keys
  inputs[:, 1:context:2] = values
  np.put_along_axis(inputs, query_pos, keys, axis=1)
  targets = np.full((n, seq_len), IGNORE_INDEX, np.int64)
  np.put_along_axis(targets, query_pos, values, axis=1)
  return inputs.astype(np.int32), targets.astype(np.int32)


def train_test_split(num_train: int, num_test: int, *, seed: int = 0,
                     **kwargs) -> MQARData:
  """A train and a test set from independent streams of one ``seed``.

  ``kwargs`` are those of ``mqar_examples`` (``vocab_size``, ``seq_len``,
  ``num_kv_pairs``, ``power_a``, ``random_non_queries``), the same for
  both sets.
  """
  train_seed, test_seed = np.random.SeedSequence(seed).spawn(2)
  train = mqar_examples(num_train, seed=train_seed, **kwargs)
  test = mqar_examples(num_test, seed=test_seed, **kwargs)
  return MQARData(*train, *test)


def accuracy(predictions, targets) -> float:
  """Fraction of the query positions (``targets != IGNORE_INDEX``) where
  ``predictions [N, T]`` equals the target."""
  predictions, targets = np.asarray(predictions), np.asarray(targets)
  mask = targets != IGNORE_INDEX
  return float((predictions[mask] == targets[mask]).mean())
