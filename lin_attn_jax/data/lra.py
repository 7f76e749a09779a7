"""Long Range Arena tasks generated locally: ListOps and Pathfinder.

Tay et al. 2020, "Long Range Arena: A Benchmark for Efficient
Transformers", https://arxiv.org/abs/2011.04006. Both tasks are made by
programs, so they are generated here, deterministically by seed, instead of
downloaded. Example ``i`` of a split is a pure function of
``(seed, split, i)``: ``ListOps`` and ``Pathfinder`` are random-access
sources (``len``, ``[i]``, ``batch(indices)``) that ``grain.MapDataset``
reads as they are.

**ListOps** (Nangia & Bowman 2018, https://arxiv.org/abs/1804.06028, as
LRA's ``lra_benchmarks/data/listops.py`` generates it): a prefix expression
over the digits 0-9 with the operators ``[MAX``, ``[MIN``, ``[MED`` (the
median of the arguments, rounded down) and ``[SM`` (their sum modulo 10),
each closed by ``]``. A node at depth ``d < max_depth`` (the root at depth
1) is an operator with probability 1/4, else a digit; an operator takes
``2 .. max_args`` arguments (uniform) and is one of the four (uniform); a
digit is uniform. Expressions whose token count (digits, operators and
``]``; LRA's ``length``) is outside ``(min_length, max_length)`` are drawn
again. The label is the expression's value (10 classes). LRA's defaults:
``max_depth = 10``, ``max_args = 10``, lengths in ``(500, 2000)``, inputs
padded to 2000 tokens. LRA's files hold the expressions with parentheses
around every application, which its tokenizer drops together with the
brackets; here the tokens are the digits, the operators and ``]`` (as S4 and
later work tokenize the same files), ids ``LISTOPS_VOCAB``.

**Pathfinder** (Linsley et al. 2018, https://arxiv.org/abs/1805.08315; the
generator ``snakes2.py`` of github.com/drewlinsley/pathfinder, with the
settings LRA's ``lra_benchmarks/data/pathfinder.py`` lists for 32 x 32 and
64 x 64): an image of curved paths made of short dashes (paddles). Two
target paths start ``seed_distance`` apart near the centre and grow
``contour_length`` dashes each; each dash turns from the previous one by an
angle drawn with weight ``cos(min(|turn| * continuity, pi / 2)) ** 2``.
``num_distractors`` shorter paths of ``contour_length // 3`` dashes fill the
rest. A dot (a disc) marks the start of one target path and another the end
of the same path (label 1) or of the other target path (label 0), so the
dots are as far apart in either case. Levels ``easy``, ``intermediate`` and
``hard`` are target paths of 6, 9 and 14 dashes (the published
``curv_baseline``, ``curv_contour_length_9`` and ``_14``; LRA reports the
hard one). The image, flattened row-major, is the sequence: ``res * res``
tokens, pixel intensities 0..255.

This generator is written from that description, not a port, and keeps the
task well posed at the pixel level: the ink (pixels > 0) of two dashes in a
row of one path is exactly ``gap`` pixels apart in the Chebyshev distance
(by default 1: the dashes' ink touches without overlapping, a dash's own
intensity fading at its ends), and the ink of different paths is at least
``clearance > gap`` apart (by default 2: one empty pixel), so the two dots
are joined through ink with gaps of up to ``gap`` pixels bridged if and
only if the label is 1 (tests/data/test_lra.py flood-fills the images to
check it). Larger gaps (visible dashes) need a larger clearance, which at
32 x 32 leaves little room for the hard level's two 14-dash paths. Images
are generated a block at a time in lockstep (vectorised over the block);
those whose target paths run into the border or another path are drawn
again (as in the published generator; those that run out of room are
dropped from the block as soon as they do), and a distractor that does not
fit is left out. Dashes are looked up, not rendered: their directions are
snapped to 256 angles and their midpoints to a 1/16-pixel grid, whose
windows are tabulated once per geometry (``_dash_table``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math

import numpy as np

from lin_attn_jax.ops.common import checks

SPLITS = ("train", "validation", "test")

LISTOPS_OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
LISTOPS_CLOSE = "]"
# Token ids: 0 padding, digits 0-9 as 1-10, the operators, then "]".
LISTOPS_VOCAB = (("<pad>",) + tuple(str(d) for d in range(10))
                 + LISTOPS_OPERATORS + (LISTOPS_CLOSE,))
LISTOPS_VOCAB_SIZE = len(LISTOPS_VOCAB)
_DIGIT_ID = 1
_OPERATOR_ID = 11
_CLOSE_ID = 15
_VALUE_P = 0.25
_UNIFORMS = 4096

PATHFINDER_LEVELS = {"easy": 6, "intermediate": 9, "hard": 14}


def _split_index(split: str) -> int:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  return SPLITS.index(split)


def _check_count(name: str, value) -> None:
  if not isinstance(value, (int, np.integer)) or value < 0:
    raise ValueError(f"{name} must be an int >= 0, got {value!r}")


class _Uniforms:
  """A stream of uniforms on [0, 1) drawn from ``rng`` in blocks."""

  def __init__(self, rng: np.random.Generator):
    self.rng, self.values, self.at = rng, np.empty(0), 0

  def __call__(self) -> float:
    if self.at == len(self.values):
      self.values, self.at = self.rng.random(_UNIFORMS).tolist(), 0
    self.at += 1
    return self.values[self.at - 1]


def _apply(op: int, values: list[int]) -> int:
  if op == 0:
    return min(values)
  if op == 1:
    return max(values)
  if op == 2:
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
      return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) // 2
  return sum(values) % 10


def _listops_tree(uniform: _Uniforms, max_depth: int, max_args: int,
                  max_length: int):
  """One draw of the grammar: ``(token ids, value)``, or None once it
  reaches ``max_length`` tokens (it would be rejected)."""
  tokens: list[int] = []
  stack: list[tuple[int, int, list[int]]] = []
  while True:
    if len(stack) + 1 < max_depth and uniform() <= _VALUE_P:
      arity = 2 + int(uniform() * (max_args - 1))
      op = int(uniform() * len(LISTOPS_OPERATORS))
      tokens.append(_OPERATOR_ID + op)
      stack.append((op, arity, []))
      continue
    value = int(uniform() * 10)
    tokens.append(_DIGIT_ID + value)
    while stack:
      op, arity, args = stack[-1]
      args.append(value)
      if len(args) < arity:
        break
      stack.pop()
      tokens.append(_CLOSE_ID)
      value = _apply(op, args)
    if not stack:
      return tokens, value
    if len(tokens) >= max_length:
      return None


def listops_example(rng: np.random.Generator, *, max_depth: int = 10,
                    max_args: int = 10, min_length: int = 500,
                    max_length: int = 2000) -> tuple[list[int], int]:
  """One ListOps expression with its token count in
  ``(min_length, max_length)``: ``(token ids, value)`` (ids of
  ``LISTOPS_VOCAB``, no padding; the value in 0..9)."""
  uniform = _Uniforms(rng)
  while True:
    tree = _listops_tree(uniform, max_depth, max_args, max_length)
    if tree is not None and min_length < len(tree[0]) < max_length:
      return tree


def listops_string(tokens) -> str:
  """The expression of ``tokens`` (ids, padding dropped) as text, e.g.
  ``"[MAX 2 9 [MIN 4 7 ] 0 ]"``."""
  return " ".join(LISTOPS_VOCAB[int(t)] for t in tokens if int(t))


def _model_arrays(tokens: np.ndarray, lengths: np.ndarray,
                  labels: np.ndarray) -> dict:
  """The classification batch: ``inputs`` int32 ``[N, T]``,
  ``segment_ids`` (1 on tokens, 0 on padding), ``positions``, ``labels``
  int32 ``[N]``."""
  steps = np.arange(tokens.shape[1])
  valid = steps[None, :] < lengths[:, None]
  return {
      "inputs": tokens.astype(np.int32),
      "segment_ids": valid.astype(np.int32),
      "positions": np.where(valid, steps, 0).astype(np.int32),
      "labels": labels.astype(np.int32),
  }


class ListOps:
  """ListOps examples of one split, by index (see the module docstring).

  Element ``i`` is a dict of ``inputs`` int32 ``[seq_len]`` (the token ids
  of ``LISTOPS_VOCAB``, 0-padded), ``segment_ids`` (1 on tokens, 0 on
  padding), ``positions`` and ``labels`` (the value, int32 scalar); it
  depends on ``(seed, split, i)`` alone.

  Args:
    num_examples: the split's size (LRA: 96,000 train, 2,000 validation,
      2,000 test).
    split: "train", "validation" or "test" (independent streams).
    seed: the data seed.
    seq_len: padded length, at least ``max_length - 1``.
    max_depth, max_args, min_length, max_length: the grammar's limits
      (LRA's defaults).
  """

  num_classes = 10
  vocab_size = LISTOPS_VOCAB_SIZE

  def __init__(self, num_examples: int, *, split: str = "train",
               seed: int = 0, seq_len: int = 2000, max_depth: int = 10,
               max_args: int = 10, min_length: int = 500,
               max_length: int = 2000):
    _check_count("num_examples", num_examples)
    for name, value in (("seq_len", seq_len), ("max_depth", max_depth),
                        ("max_length", max_length)):
      checks.positive_int(name, value)
    if not isinstance(max_args, int) or max_args < 2:
      raise ValueError(f"max_args must be an int >= 2, got {max_args!r}")
    if not isinstance(min_length, int) or not 0 <= min_length < max_length - 1:
      raise ValueError(f"min_length must be an int in [0, max_length - 1) = "
                       f"[0, {max_length - 1}), got {min_length!r}")
    if seq_len < max_length - 1:
      raise ValueError(f"seq_len = {seq_len} is shorter than the longest "
                       f"expression, max_length - 1 = {max_length - 1}")
    self.num_examples, self.seq_len = int(num_examples), seq_len
    self.key = (int(seed), _split_index(split))
    self.grammar = dict(max_depth=max_depth, max_args=max_args,
                        min_length=min_length, max_length=max_length)

  def __len__(self) -> int:
    return self.num_examples

  def expression(self, index: int) -> tuple[list[int], int]:
    """``(token ids, value)`` of example ``index``, unpadded."""
    if not 0 <= index < self.num_examples:
      raise IndexError(f"index {index} is outside [0, {self.num_examples})")
    rng = np.random.default_rng([*self.key, int(index)])
    return listops_example(rng, **self.grammar)

  def batch(self, indices) -> dict:
    """Examples ``indices`` stacked: ``[len(indices), seq_len]`` arrays and
    ``labels [len(indices)]``."""
    indices = [int(i) for i in indices]
    tokens = np.zeros((len(indices), self.seq_len), np.int32)
    lengths = np.zeros(len(indices), np.int64)
    labels = np.zeros(len(indices), np.int32)
    for row, index in enumerate(indices):
      ids, labels[row] = self.expression(index)
      tokens[row, :len(ids)] = ids
      lengths[row] = len(ids)
    return _model_arrays(tokens, lengths, labels)

  def __getitem__(self, index: int) -> dict:
    return {name: value[0] for name, value
            in self.batch([int(index)]).items()}


@dataclasses.dataclass(frozen=True)
class PathfinderConfig:
  """The geometry of a Pathfinder image; lengths in pixels.

  ``pathfinder_config`` gives LRA's settings for a resolution and level.
  """

  resolution: int           # the image is resolution x resolution
  contour_length: int       # dashes per target path (6, 9, 14 by level)
  distractor_length: int    # dashes per distractor path
  num_distractors: int      # distractor paths tried (those that fit stay)
  paddle_length: float      # length of a dash's centre line
  paddle_thickness: float   # width of a dash
  marker_radius: float      # radius of the two dots
  seed_distance: float      # distance between the target paths' starts
  continuity: float         # turn weight cos(min(|turn| c, pi / 2)) ** 2
  contrast: float           # dash intensity factor (clipped to 1)
  padding: int = 1          # empty border, pixels
  gap: int = 1              # Chebyshev distance between dashes in a row
  clearance: int = 2        # least Chebyshev distance between paths
  spacings: tuple[float, ...] = (1.0, 2.0)  # dash-to-dash steps tried
  num_angles: int = 16      # turn candidates per dash

  def __post_init__(self):
    for name in ("resolution", "contour_length", "distractor_length",
                 "gap", "num_angles"):
      checks.positive_int(name, getattr(self, name))
    if self.num_distractors < 0 or self.padding < 0:
      raise ValueError("num_distractors and padding must be >= 0")
    if self.clearance <= self.gap:
      raise ValueError(f"clearance ({self.clearance}) must exceed gap "
                       f"({self.gap}): paths must stay farther apart than "
                       "the dashes of one path")
    if 4 * self.seed_distance >= self.resolution:
      raise ValueError(f"seed_distance {self.seed_distance} leaves no room "
                       f"for the starts in a {self.resolution}-pixel image")


def pathfinder_config(resolution: int = 32,
                      level: str = "hard") -> PathfinderConfig:
  """LRA's Pathfinder settings (``lra_benchmarks/data/pathfinder.py``) at
  ``resolution`` 32 or 64 and ``level`` easy, intermediate or hard."""
  if level not in PATHFINDER_LEVELS:
    raise ValueError(f"level must be one of {tuple(PATHFINDER_LEVELS)}, "
                     f"got {level!r}")
  length = PATHFINDER_LEVELS[level]
  distractor = length // 3
  if resolution == 32:
    return PathfinderConfig(
        resolution=32, contour_length=length, distractor_length=distractor,
        num_distractors=20 // distractor, paddle_length=2.0,
        paddle_thickness=0.5, marker_radius=1.5, seed_distance=7.0,
        continuity=1.0, contrast=1.5)
  if resolution == 64:
    return PathfinderConfig(
        resolution=64, contour_length=length, distractor_length=distractor,
        num_distractors=22 // distractor, paddle_length=5.0,
        paddle_thickness=1.0, marker_radius=2.5, seed_distance=12.0,
        continuity=1.8, contrast=0.8)
  raise ValueError(f"resolution must be 32 or 64, got {resolution!r}")


def _dilate(mask: np.ndarray, radius: int) -> np.ndarray:
  """``mask [..., W, W]`` dilated by a ``(2 radius + 1)``-square (the
  pixels within Chebyshev distance ``radius``); nothing enters from
  outside the window."""
  out = mask
  for axis in (-1, -2):
    grown = out.copy()
    for shift in range(1, radius + 1):
      lead = [slice(None)] * out.ndim
      lag = [slice(None)] * out.ndim
      lead[axis], lag[axis] = slice(shift, None), slice(None, -shift)
      grown[tuple(lead)] |= out[tuple(lag)]
      grown[tuple(lag)] |= out[tuple(lead)]
    out = grown
  return out


_ANGLE_BINS = 256   # dash directions drawn from the table
_SUBPIXEL = 16      # dash midpoints on a 1/16-pixel grid


@functools.lru_cache(maxsize=8)
def _dash_table(length: float, half: float, contrast: float, radius: int):
  """The 8-bit windows ``[A, S + 1, S + 1, W, W]`` (``W = 2 radius + 1``)
  of a dash of centre-line ``length`` and half-width ``half`` with
  direction ``2 pi a / A`` and midpoint ``(fy, fx) / S - 1/2`` pixels off
  the window's centre pixel, ``_Canvas.window``'s formula: every candidate
  dash is a table look-up."""
  angles = np.arange(_ANGLE_BINS) * 2 * np.pi / _ANGLE_BINS
  offsets = np.arange(_SUBPIXEL + 1) / _SUBPIXEL - 0.5
  direction = _directions(angles)                                # [A, 2]
  mid = np.stack(np.meshgrid(offsets, offsets, indexing="ij"), -1)  # [S,S,2]
  p0 = mid[None] - length / 2 * direction[:, None, None]       # [A, S, S, 2]
  p1 = mid[None] + length / 2 * direction[:, None, None]
  span = np.arange(-radius, radius + 1)
  y, x = np.broadcast_arrays(span[:, None], span[None, :])
  return _render(p0, p1, y, x, half, contrast)


def _render(p0, p1, y, x, half: float, contrast: float) -> np.ndarray:
  """8-bit values at pixels ``(y, x) [..., W, W]`` (broadcast against
  ``p0, p1 [..., 2]``) of the element from ``p0`` to ``p1``:
  ``contrast * clip(half + 0.5 - d, 0, 1)`` clipped to 1."""
  p0 = p0.astype(np.float32)
  sy, sx = ((p1 - p0).astype(np.float32)[..., i, None, None]
            for i in range(2))                                 # [..., 1, 1]
  ry = y.astype(np.float32) - p0[..., 0, None, None]           # [..., W, W]
  rx = x.astype(np.float32) - p0[..., 1, None, None]
  norm = np.maximum(sy * sy + sx * sx, np.float32(1e-12))
  t = np.clip((ry * sy + rx * sx) / norm, 0.0, 1.0)
  ry -= t * sy
  rx -= t * sx
  dist = np.sqrt(ry * ry + rx * rx)
  value = np.minimum(np.float32(contrast) * np.clip(
      np.float32(half + 0.5) - dist, 0.0, 1.0), 1.0)
  return np.rint(255.0 * value).astype(np.uint8)


class _Canvas:
  """The images of a block of examples while their paths are drawn.

  Every element (a dash or a dot) is drawn in a square window around its
  centre: ``value = contrast * clip(h + 0.5 - d, 0, 1)`` (clipped to 1) for
  a pixel at distance ``d`` from the element's centre line, half-width
  ``h``; its ink is the pixels whose 8-bit value is above 0. ``blocked``
  holds the ink of every committed element dilated by ``clearance - 1``;
  the last two elements of a path stay ``pending`` (its next element may
  come close to them) until a newer one commits them. Candidates are
  tested in windows just large enough for their ink, against one map of
  flags per step; a chosen element is redrawn in a window with room for
  its dilation.
  """

  FORBIDDEN, TOO_CLOSE, NEAR = 1, 2, 4

  def __init__(self, cfg: PathfinderConfig, batch: int, paths: int):
    self.cfg, self.n = cfg, batch
    res = cfg.resolution
    reach = max(cfg.paddle_length / 2 + cfg.paddle_thickness / 2,
                cfg.marker_radius) + 0.5
    self.small = int(math.ceil(reach))
    self.large = self.small + max(cfg.clearance - 1, cfg.gap)
    self.image = np.zeros((batch, res, res), np.uint8)
    self.blocked = np.zeros((batch, res, res), bool)
    self.pending = np.zeros((batch, paths, 2, res, res), bool)
    outside = np.ones((res, res), bool)
    outside[cfg.padding:res - cfg.padding, cfg.padding:res - cfg.padding] = 0
    self.outside = outside
    self.rows = np.arange(batch)

  def window(self, p0: np.ndarray, p1: np.ndarray, half: float,
             contrast: float, large: bool = True):
    """The windows of elements from ``p0`` to ``p1`` (``[n, ..., 2]``
    (y, x) float): ``(y, x)`` int ``[n, ..., W, W]`` pixel coordinates and
    the 8-bit values there."""
    radius = self.large if large else self.small
    span = np.arange(-radius, radius + 1)
    centre = np.rint((p0 + p1) / 2).astype(np.int64)             # [n, ..., 2]
    y = centre[..., 0, None, None] + span[:, None]             # [n, ..., W, W]
    x = centre[..., 1, None, None] + span[None, :]
    y, x = np.broadcast_arrays(y, x)
    return y, x, _render(p0, p1, y, x, half, contrast)

  def dash(self, mid: np.ndarray, angle: np.ndarray, large: bool = True):
    """Dashes of the configured size at midpoints ``mid [n, ..., 2]`` and
    directions ``angle [n, ...]``, snapped to the table's grid
    (``_dash_table``): ``(y, x, value)`` windows as ``window`` gives them,
    and the snapped ``(p0, p1, angle)``."""
    cfg = self.cfg
    radius = self.large if large else self.small
    table = _dash_table(cfg.paddle_length, cfg.paddle_thickness / 2,
                        cfg.contrast, radius)
    turn = np.rint(angle * (_ANGLE_BINS / (2 * np.pi))).astype(np.int64)
    angle = turn * (2 * np.pi / _ANGLE_BINS)
    centre = np.rint(mid).astype(np.int64)                      # [n, ..., 2]
    sub = np.rint((mid - centre) * _SUBPIXEL).astype(np.int64)
    sub = np.clip(sub, -_SUBPIXEL // 2, _SUBPIXEL // 2)
    mid = centre + sub / _SUBPIXEL
    half = cfg.paddle_length / 2 * _directions(angle)
    sub += _SUBPIXEL // 2
    value = table[turn % _ANGLE_BINS, sub[..., 0], sub[..., 1]]
    span = np.arange(-radius, radius + 1)
    y = centre[..., 0, None, None] + span[:, None]             # [n, ..., W, W]
    x = centre[..., 1, None, None] + span[None, :]
    y, x = np.broadcast_arrays(y, x)
    return y, x, value, mid - half, mid + half, angle

  def flags(self, forbid: np.ndarray, previous=None) -> np.ndarray:
    """``[n, res, res]`` uint8: ``FORBIDDEN`` on ``forbid`` and the
    padding; with ``previous`` (a dash's window ``(y, x, ink)``),
    ``TOO_CLOSE`` within ``gap - 1`` of its ink and ``NEAR`` within
    ``gap``."""
    codes = (forbid | self.outside).astype(np.uint8) * self.FORBIDDEN
    if previous is not None:
      y, x, ink = previous
      gap = self.cfg.gap
      close = np.zeros(codes.shape, bool)
      near = np.zeros(codes.shape, bool)
      self.stamp(close, y, x, _dilate(ink, gap - 1))
      self.stamp(near, y, x, _dilate(ink, gap))
      codes |= close.astype(np.uint8) * self.TOO_CLOSE
      codes |= near.astype(np.uint8) * self.NEAR
    return codes

  def fits(self, y, x, ink, codes, previous: bool = False):
    """``[n, ...]``: the windows' ink is off every ``FORBIDDEN`` pixel
    (and, with ``previous``, off ``TOO_CLOSE`` and on some ``NEAR``)."""
    res, n = self.cfg.resolution, len(codes)
    pad = 2 * self.large + 4
    wide = res + 2 * pad
    padded = np.pad(codes, ((0, 0), (pad, pad), (pad, pad)),
                    constant_values=self.FORBIDDEN).reshape(-1)
    rows = self.rows[:n].reshape((-1,) + (1,) * (y.ndim - 1))
    at = (rows * wide + np.clip(y + pad, 0, wide - 1)) * wide + np.clip(
        x + pad, 0, wide - 1)
    found = np.where(ink, padded[at], 0)
    hit = np.bitwise_or.reduce(found.reshape(
        found.shape[:-2] + (found.shape[-2] * found.shape[-1],)), axis=-1)
    ok = (hit & self.FORBIDDEN) == 0
    if previous:
      ok &= ((hit & self.TOO_CLOSE) == 0) & ((hit & self.NEAR) != 0)
    return ok

  def stamp(self, maps: np.ndarray, y, x, on) -> None:
    """Sets ``maps [n, res, res]`` where ``on [n, W, W]`` at the windows'
    pixels inside the image."""
    res = self.cfg.resolution
    on = on & (y >= 0) & (y < res) & (x >= 0) & (x < res)
    rows = np.broadcast_to(self.rows[:len(maps), None, None], on.shape)
    maps[rows[on], y[on], x[on]] = True

  def draw(self, y, x, value, where: np.ndarray) -> None:
    """Draws windows ``[n, W, W]`` of 8-bit values into the images where
    ``where [n]`` (the brighter value wins)."""
    res = self.cfg.resolution
    on = ((value > 0) & (y >= 0) & (y < res) & (x >= 0) & (x < res)
          & where[:, None, None])
    rows = np.broadcast_to(self.rows[:, None, None], on.shape)[on]
    ys, xs = y[on], x[on]
    self.image[rows, ys, xs] = np.maximum(self.image[rows, ys, xs],
                                          value[on])

  def commit(self, path: int, y, x, ink, where: np.ndarray) -> None:
    """Pushes the element ``(y, x, ink)`` (``[n, W, W]``, a large window)
    onto ``path``'s pending pair where ``where [n]``; the oldest pending
    one is blocked."""
    grown = _dilate(ink, self.cfg.clearance - 1) & where[:, None, None]
    self.blocked[where] |= self.pending[where, path, 0]
    self.pending[where, path, 0] = self.pending[where, path, 1]
    self.pending[where, path, 1] = False
    self.stamp(self.pending[:, path, 1], y, x, grown)

  def keep(self, rows: np.ndarray) -> None:
    """Drops every example but ``rows`` (those still being drawn)."""
    self.image, self.blocked, self.pending = (
        a[rows] for a in (self.image, self.blocked, self.pending))
    self.n, self.rows = len(rows), np.arange(len(rows))

  def flush(self, path: int) -> None:
    self.blocked |= self.pending[:, path].any(axis=1)
    self.pending[:, path] = False


def _sample(rng: np.random.Generator, weights: np.ndarray):
  """Per row of ``weights [n, C]`` (>= 0), an index drawn in proportion to
  the weights, and whether the row had any weight."""
  total = weights.sum(axis=1)
  cumulative = np.cumsum(weights, axis=1)
  u = rng.random(len(weights)) * total
  index = np.argmax(cumulative > u[:, None], axis=1)
  return index, total > 0


def _directions(angle: np.ndarray) -> np.ndarray:
  return np.stack([np.sin(angle), np.cos(angle)], axis=-1)


class _Paths:
  """Dash-by-dash growth of one path per example of a canvas."""

  def __init__(self, canvas: _Canvas, rng: np.random.Generator):
    self.canvas, self.rng, self.cfg = canvas, rng, canvas.cfg
    count = self.cfg.num_angles
    self.turns = np.arange(count) / count * 2 * np.pi - np.pi
    self.spacings = np.asarray(self.cfg.spacings)

  def first(self, tail: np.ndarray, forbid: np.ndarray, alive: np.ndarray):
    """A first dash from ``tail [n, 2]`` in a uniform direction: the
    chosen ``(y, x, value)`` window, its ``head`` and ``angle``, and which
    rows found room (among ``alive``)."""
    angles = self.rng.random((len(tail), 1)) * 2 * np.pi + self.turns
    p0 = np.broadcast_to(tail[:, None], angles.shape + (2,))
    weights = np.ones(angles.shape)
    return self._choose(p0, angles, weights, self.canvas.flags(forbid),
                        False, alive)

  def extend(self, head: np.ndarray, angle: np.ndarray, previous,
             forbid: np.ndarray, alive: np.ndarray):
    """The next dash after the dash ending at ``head [n, 2]`` with
    direction ``angle [n]``; ``previous`` is that dash's window
    ``(y, x, ink)``, whose ink the new one's must meet at exactly ``gap``
    (Chebyshev). Turns are weighted ``cos(min(|turn| c, pi / 2)) ** 2``."""
    cfg, n = self.cfg, len(head)
    jitter = self.rng.random((n, 1)) * 2 * np.pi / cfg.num_angles
    turns = self.turns + jitter                                  # [n, A]
    weight = np.cos(np.minimum(np.abs(turns) * cfg.continuity,
                               np.pi / 2)) ** 2
    angles = angle[:, None] + turns                              # [n, A]
    step = (_directions(angle)[:, None] + _directions(angles)) / 2
    p0 = (head[:, None, None] + self.spacings[:, None, None]
          * step[:, None])                                       # [n, S, A, 2]
    angles = np.broadcast_to(angles[:, None], p0.shape[:-1])
    weights = np.broadcast_to(weight[:, None], p0.shape[:-1])
    flat = lambda a: a.reshape((n, -1) + a.shape[3:])
    return self._choose(flat(p0), flat(angles), flat(weights),
                        self.canvas.flags(forbid, previous), True, alive)

  def _choose(self, p0, angles, weights, codes, previous, alive):
    canvas, cfg = self.canvas, self.cfg
    mid = p0 + cfg.paddle_length / 2 * _directions(angles)
    y, x, value, _, _, _ = canvas.dash(mid, angles, large=False)
    ok = canvas.fits(y, x, value > 0, codes, previous)
    index, found = _sample(self.rng, weights * ok)
    rows = np.arange(len(p0))
    y, x, value, _, head, angle = canvas.dash(mid[rows, index],
                                              angles[rows, index])
    return y, x, value, head, angle, found & alive


def _target_paths(rng: np.random.Generator, cfg: PathfinderConfig, n: int):
  """Two target paths and the dots on up to ``n`` canvases: ``(image,
  blocked, labels, dots, done)``; rows with ``done`` False found no room
  and are to be drawn again (most of those that run out of room on the
  way are dropped as soon as they do)."""
  canvas = _Canvas(cfg, n, 2)
  paths = _Paths(canvas, rng)
  res, rows = cfg.resolution, np.arange(n)
  low = 2 * cfg.seed_distance
  start_a = np.rint(low + rng.random((n, 2)) * (res - 2 * low - 1))
  theta = rng.random(n) * 2 * np.pi
  start_b = np.rint(start_a + cfg.seed_distance * _directions(theta))
  starts = np.stack([start_a, start_b], axis=1)                   # [n, 2, 2]
  alive = np.ones(n, bool)
  dots = []
  for p in range(2):
    y, x, value = canvas.window(starts[:, p], starts[:, p],
                                cfg.marker_radius, 1.0)
    codes = canvas.flags(canvas.pending[:, 1 - p].any(axis=1))
    alive &= canvas.fits(y, x, value > 0, codes)
    canvas.commit(p, y, x, value > 0, alive)
    dots.append((y, x, value))
  heads = starts.copy()
  angles = np.zeros((n, 2))
  last = [None, None]
  for step in range(cfg.contour_length):
    for p in range(2):
      forbid = canvas.blocked | canvas.pending[:, 1 - p].any(axis=1)
      if step == 0:
        y, x, value, head, angle, found = paths.first(starts[:, p], forbid,
                                                      alive)
      else:
        y, x, value, head, angle, found = paths.extend(
            heads[:, p], angles[:, p], last[p], forbid, alive)
      alive &= found
      canvas.commit(p, y, x, value > 0, alive)
      canvas.draw(y, x, value, alive)
      heads[:, p], angles[:, p], last[p] = head, angle, (y, x, value > 0)
    if alive.mean() < 0.75:
      keep = np.flatnonzero(alive)
      canvas.keep(keep)
      starts, heads, angles, alive = (a[keep] for a in (starts, heads,
                                                        angles, alive))
      last = [tuple(a[keep] for a in window) for window in last]
      dots = [tuple(a[keep] for a in window) for window in dots]
      n, rows = len(keep), np.arange(len(keep))
  origin = rng.integers(0, 2, n)
  labels = rng.integers(0, 2, n).astype(np.int32)
  terminal = np.where(labels == 1, origin, 1 - origin)
  end = heads[rows, terminal]
  y, x, value = canvas.window(end, end, cfg.marker_radius, 1.0)
  other = canvas.pending[rows, 1 - terminal].any(axis=1)
  alive &= canvas.fits(y, x, value > 0, canvas.flags(canvas.blocked | other))
  canvas.draw(y, x, value, alive)
  first_is_b = (origin == 1)[:, None, None]
  canvas.draw(*(np.where(first_is_b, b, a) for a, b in zip(*dots)), alive)
  for p in range(2):
    canvas.flush(p)
  canvas.stamp(canvas.blocked, y, x, _dilate(value > 0, cfg.clearance - 1))
  dots_yx = np.stack([starts[rows, origin], end], axis=1)
  return canvas.image, canvas.blocked, labels, dots_yx, alive


def _distractors(rng: np.random.Generator, cfg: PathfinderConfig,
                 image: np.ndarray, blocked: np.ndarray) -> np.ndarray:
  """Adds to ``image [n, res, res]`` the distractor paths that fit: each
  starts at the first free one of a few random points, and is left out
  if it runs out of room."""
  n = len(image)
  canvas = _Canvas(cfg, n, 1)
  canvas.image, canvas.blocked = image, blocked
  paths = _Paths(canvas, rng)
  res, tries = cfg.resolution, 8
  for _ in range(cfg.num_distractors):
    saved_image, saved_blocked = canvas.image.copy(), canvas.blocked.copy()
    tails = cfg.padding + rng.random((n, tries, 2)) * (res - 2 * cfg.padding)
    y, x, value = canvas.window(tails, tails, cfg.paddle_thickness / 2,
                                cfg.contrast, large=False)
    free = canvas.fits(y, x, value > 0, canvas.flags(canvas.blocked))
    alive = free.any(axis=1)
    tail = tails[np.arange(n), np.argmax(free, axis=1)]
    y, x, value, head, angle, found = paths.first(tail, canvas.blocked,
                                                  alive)
    alive &= found
    last = (y, x, value > 0)
    for dash in range(cfg.distractor_length):
      if dash:
        y, x, value, head, angle, found = paths.extend(
            head, angle, last, canvas.blocked, alive)
        alive &= found
      canvas.commit(0, y, x, value > 0, alive)
      canvas.draw(y, x, value, alive)
      last = (y, x, value > 0)
    canvas.flush(0)
    canvas.image[~alive] = saved_image[~alive]
    canvas.blocked[~alive] = saved_blocked[~alive]
  return canvas.image


def pathfinder_images(rng: np.random.Generator, num_examples: int,
                      cfg: PathfinderConfig, max_rounds: int = 100):
  """``num_examples`` Pathfinder images drawn together.

  Returns:
    ``(images, labels, dots)``: uint8 ``[N, res, res]``, int32 ``[N]`` (1
    when the dots are on one path) and float ``[N, 2, 2]`` (the (y, x)
    centres of the start dot and the end dot).
  """
  _check_count("num_examples", num_examples)
  res = cfg.resolution
  images = np.zeros((num_examples, res, res), np.uint8)
  blocked = np.zeros((num_examples, res, res), bool)
  labels = np.zeros(num_examples, np.int32)
  dots = np.zeros((num_examples, 2, 2))
  todo = np.arange(num_examples)
  for _ in range(max_rounds):
    if not len(todo):
      break
    attempts = max(4 * len(todo), 64)
    image, block, label, dot, done = _target_paths(rng, cfg, attempts)
    good = np.flatnonzero(done)[:len(todo)]
    rows, todo = todo[:len(good)], todo[len(good):]
    images[rows], blocked[rows] = image[good], block[good]
    labels[rows], dots[rows] = label[good], dot[good]
  if len(todo):
    raise RuntimeError(f"{len(todo)} of {num_examples} Pathfinder images "
                       f"found no room for their paths in {max_rounds} "
                       f"rounds: {cfg}")
  images = _distractors(rng, cfg, images, blocked)
  return images, labels, dots


class Pathfinder:
  """Pathfinder examples of one split, by index (see the module
  docstring).

  Element ``i`` is a dict of ``inputs`` int32 ``[res * res]`` (the image's
  pixels row by row, 0..255), ``segment_ids`` (all 1), ``positions`` and
  ``labels`` (1 when the dots are on one path); it depends on
  ``(seed, split, i)`` alone. Images are drawn ``block`` at a time, each
  block from its own stream, and the latest blocks are kept.

  Args:
    num_examples: the split's size.
    split: "train", "validation" or "test" (independent streams).
    seed: the data seed.
    resolution: 32 or 64 (``pathfinder_config``), or give ``config``.
    level: "easy", "intermediate" or "hard" (LRA's).
    config: a ``PathfinderConfig`` instead of ``resolution`` and ``level``.
    block: images drawn together.
  """

  num_classes = 2
  vocab_size = 256

  def __init__(self, num_examples: int, *, split: str = "train",
               seed: int = 0, resolution: int = 32, level: str = "hard",
               config: PathfinderConfig | None = None, block: int = 256):
    _check_count("num_examples", num_examples)
    checks.positive_int("block", block)
    self.config = config or pathfinder_config(resolution, level)
    self.num_examples, self.block = int(num_examples), block
    self.seq_len = self.config.resolution ** 2
    self.key = (int(seed), _split_index(split))
    self._blocks: collections.OrderedDict = collections.OrderedDict()

  def __len__(self) -> int:
    return self.num_examples

  def _block(self, number: int):
    if number not in self._blocks:
      rng = np.random.default_rng([*self.key, number])
      count = min(self.block, self.num_examples - number * self.block)
      self._blocks[number] = pathfinder_images(rng, count, self.config)
      if len(self._blocks) > 4:
        self._blocks.popitem(last=False)
    return self._blocks[number]

  def images(self, indices):
    """``(images, labels, dots)`` of examples ``indices`` (see
    ``pathfinder_images``)."""
    indices = np.asarray([int(i) for i in indices], np.int64)
    if len(indices) and (indices.min() < 0
                         or indices.max() >= self.num_examples):
      raise IndexError(f"indices outside [0, {self.num_examples})")
    res = self.config.resolution
    images = np.zeros((len(indices), res, res), np.uint8)
    labels = np.zeros(len(indices), np.int32)
    dots = np.zeros((len(indices), 2, 2))
    for number in np.unique(indices // self.block):
      rows = np.flatnonzero(indices // self.block == number)
      block_images, block_labels, block_dots = self._block(int(number))
      at = indices[rows] - number * self.block
      images[rows], labels[rows] = block_images[at], block_labels[at]
      dots[rows] = block_dots[at]
    return images, labels, dots

  def batch(self, indices) -> dict:
    """Examples ``indices`` stacked: ``inputs [len(indices), res * res]``
    and the rest as ``ListOps.batch``."""
    images, labels, _ = self.images(indices)
    tokens = images.reshape(len(images), -1)
    lengths = np.full(len(images), tokens.shape[1])
    return _model_arrays(tokens, lengths, labels)

  def __getitem__(self, index: int) -> dict:
    return {name: value[0] for name, value
            in self.batch([int(index)]).items()}


def ink_connected(image: np.ndarray, start, end, reach: int) -> bool:
  """Whether the ink (pixels > 0) of ``image [res, res]`` joins the pixels
  at ``start`` and ``end`` ((y, x), rounded), a step going to any ink pixel
  within Chebyshev distance ``reach`` (``reach = config.gap`` bridges the
  dash gaps of a path and nothing more). A breadth-first flood fill."""
  ink = np.asarray(image) > 0
  res = ink.shape[0]
  start = tuple(int(v) for v in np.rint(start))
  end = tuple(int(v) for v in np.rint(end))
  if not (ink[start] and ink[end]):
    return False
  seen = np.zeros_like(ink)
  seen[start] = True
  queue = collections.deque([start])
  while queue:
    y, x = queue.popleft()
    if (y, x) == end:
      return True
    y0, y1 = max(y - reach, 0), min(y + reach + 1, res)
    x0, x1 = max(x - reach, 0), min(x + reach + 1, res)
    new = ink[y0:y1, x0:x1] & ~seen[y0:y1, x0:x1]
    seen[y0:y1, x0:x1] |= new
    queue.extend((y0 + dy, x0 + dx) for dy, dx in zip(*np.nonzero(new)))
  return False
