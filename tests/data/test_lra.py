"""The Long Range Arena generators: ListOps against an independent
evaluator and LRA's grammar limits, Pathfinder's labels against a flood
fill of the rendered images; both deterministic by seed."""

import collections

import numpy as np
import pytest

from lin_attn_jax.data import lra

LISTOPS_N = 24


@pytest.fixture(scope="module")
def listops():
  source = lra.ListOps(LISTOPS_N, seed=3)
  return source, source.batch(range(LISTOPS_N))


def evaluate(text: str) -> tuple[int, int]:
  """``(value, operator depth)`` of a ListOps string, by recursive
  descent."""
  words = text.split()
  at = 0

  def node():
    nonlocal at
    word = words[at]
    at += 1
    if word.isdigit():
      return int(word), 0
    args, depth = [], 0
    while words[at] != "]":
      value, d = node()
      args.append(value)
      depth = max(depth, d)
    at += 1
    if word == "[MIN":
      value = min(args)
    elif word == "[MAX":
      value = max(args)
    elif word == "[MED":
      value = int(np.median(args))
    elif word == "[SM":
      value = sum(args) % 10
    else:
      raise ValueError(word)
    return value, depth + 1

  value, depth = node()
  assert at == len(words)
  return value, depth


def test_listops_labels_match_an_independent_evaluator(listops):
  source, batch = listops
  depths = []
  for row in range(LISTOPS_N):
    text = lra.listops_string(batch["inputs"][row])
    value, depth = evaluate(text)
    assert value == batch["labels"][row]
    depths.append(depth)
  # Operators open at depths 1 .. max_depth - 1 (LRA: max_depth = 10); an
  # expression of more than 500 tokens nearly always reaches the limit
  # (all of 2,000 measured, docs/training.md).
  assert max(depths) == 9 and min(depths) >= 7


def test_listops_lengths_padding_and_classes(listops):
  source, batch = listops
  lengths = batch["segment_ids"].sum(axis=1)
  assert lengths.min() > 500 and lengths.max() < 2000
  assert batch["inputs"].shape == (LISTOPS_N, 2000)
  assert (batch["inputs"][batch["segment_ids"] == 0] == 0).all()
  assert (batch["inputs"][batch["segment_ids"] == 1] > 0).all()
  assert batch["inputs"].max() < lra.LISTOPS_VOCAB_SIZE
  counts = collections.Counter(batch["labels"].tolist())
  assert len(counts) >= 4 and max(counts.values()) < LISTOPS_N / 2


def test_listops_is_deterministic_by_seed_split_and_index(listops):
  source, batch = listops
  again = lra.ListOps(LISTOPS_N, seed=3)
  for index in (5, 0, 17):
    item = again[index]
    np.testing.assert_array_equal(item["inputs"], batch["inputs"][index])
    assert item["labels"] == batch["labels"][index]
  other = lra.ListOps(LISTOPS_N, seed=3, split="test")[0]["inputs"]
  assert not np.array_equal(other, batch["inputs"][0])
  with pytest.raises(ValueError, match="split"):
    lra.ListOps(4, split="dev")


def connected(image: np.ndarray, start, end, reach: int) -> bool:
  """Whether ink (pixels > 0) joins the pixels ``start`` and ``end``,
  stepping over gaps: a step goes to any ink pixel within Chebyshev
  distance ``reach``."""
  ink = image > 0
  res = image.shape[0]
  start, end = tuple(np.rint(start).astype(int)), tuple(
      np.rint(end).astype(int))
  assert ink[start] and ink[end]
  seen = np.zeros_like(ink)
  seen[start] = True
  queue = collections.deque([start])
  while queue:
    y, x = queue.popleft()
    if (y, x) == end:
      return True
    for dy in range(-reach, reach + 1):
      for dx in range(-reach, reach + 1):
        v, u = y + dy, x + dx
        if 0 <= v < res and 0 <= u < res and ink[v, u] and not seen[v, u]:
          seen[v, u] = True
          queue.append((v, u))
  return False


@pytest.fixture(scope="module")
def pathfinder32():
  source = lra.Pathfinder(96, seed=1, resolution=32, level="hard", block=48)
  return source, source.images(range(96))


def test_pathfinder_flood_fill_agrees_with_labels(pathfinder32):
  source, (images, labels, dots) = pathfinder32
  cfg = source.config
  joined = 0
  for image, label, (start, end) in zip(images, labels, dots):
    assert connected(image, start, end, cfg.gap) == bool(label)
    joined += connected(image, start, end, cfg.gap + 1) != bool(label)
  # Paths come as close as the clearance allows: bridging one pixel more
  # than the dash gaps joins distinct paths (the check above is tight).
  assert joined > 0
  assert 0.3 < labels.mean() < 0.7


def test_pathfinder_images_and_batches(pathfinder32):
  source, (images, labels, _) = pathfinder32
  assert images.shape == (96, 32, 32) and images.dtype == np.uint8
  ink = (images > 0).mean(axis=(1, 2))
  assert 0.08 < ink.min() and ink.max() < 0.4
  # Nothing in the padding.
  assert (images[:, 0] == 0).all() and (images[:, :, -1] == 0).all()
  batch = source.batch([3, 50])
  np.testing.assert_array_equal(batch["inputs"][1],
                                images[50].reshape(-1).astype(np.int32))
  assert batch["inputs"].shape == (2, 1024)
  np.testing.assert_array_equal(batch["labels"], labels[[3, 50]])
  assert (batch["segment_ids"] == 1).all()


def test_pathfinder_is_deterministic_by_seed_split_and_index(pathfinder32):
  source, (images, labels, _) = pathfinder32
  again = lra.Pathfinder(96, seed=1, resolution=32, level="hard", block=48)
  item = again[60]
  np.testing.assert_array_equal(item["inputs"], images[60].reshape(-1))
  assert item["labels"] == labels[60]
  other = lra.Pathfinder(96, seed=2, resolution=32, block=48).images([60])
  assert not np.array_equal(other[0][0], images[60])


def test_pathfinder_levels_follow_lra():
  for level, length in (("easy", 6), ("intermediate", 9), ("hard", 14)):
    cfg = lra.pathfinder_config(32, level)
    assert cfg.contour_length == length
    assert cfg.distractor_length == length // 3
    assert cfg.num_distractors == 20 // (length // 3)
  assert lra.pathfinder_config(64, "hard").num_distractors == 22 // 4
  with pytest.raises(ValueError, match="resolution"):
    lra.pathfinder_config(128)


@pytest.mark.slow
def test_pathfinder64_flood_fill_agrees_with_labels():
  source = lra.Pathfinder(32, seed=0, resolution=64, level="hard", block=32)
  images, labels, dots = source.images(range(32))
  for image, label, (start, end) in zip(images, labels, dots):
    assert connected(image, start, end, source.config.gap) == bool(label)
