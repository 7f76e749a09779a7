"""Batches for training steps: each process reads only its own rows.

The global batch of step ``s`` is ``B`` packed rows spread over the epoch:
with ``S = rows_per_epoch // B`` steps per epoch, row ``p`` of the batch is
row ``p * S + s mod S`` of epoch ``s // S`` (``B`` the global batch size),
whatever the mesh or the number of processes. Consecutive rows are one
stretch of the stream, often of one document, so a batch of them would give
gradients of one file at a time; rows ``S`` apart come from all over the
corpus, and every row of an epoch is still read once. A process holds the
rows its devices need (``process_rows``), reads only those, and
``global_batch_to_device`` assembles the global arrays from the parts every
process holds. The per-step reading runs in a grain dataset
(``BatchSource.iterator``) with read-ahead threads; since a batch is a pure
function of the step, the data state a checkpoint needs is the step itself.
"""

from __future__ import annotations

import grain
import jax
import numpy as np

from lin_attn_jax import sharding as shd
from lin_attn_jax.data.packing import PackedRows
from lin_attn_jax.ops.common import checks


def process_rows(mesh: jax.sharding.Mesh, global_batch: int) -> np.ndarray:
  """The positions in ``[0, global_batch)`` that this process's devices hold
  under ``batch_sharding(mesh)`` (sorted)."""
  check_global_batch(mesh, global_batch)
  sharding = shd.batch_sharding(mesh)
  index_map = sharding.addressable_devices_indices_map((global_batch, 1))
  rows = set()
  for index in index_map.values():
    rows.update(range(*index[0].indices(global_batch)))
  return np.array(sorted(rows), np.int64)


def check_global_batch(mesh: jax.sharding.Mesh, global_batch: int) -> None:
  parts = shd.batch_divisor(mesh)
  checks.positive_int("batch size", global_batch)
  if global_batch % parts:
    raise ValueError(f"batch size {global_batch} is not divisible by data x "
                     f"fsdp = {parts} (mesh {shd.describe(mesh)})")


class BatchSource:
  """The rows of every step that one process reads.

  Args:
    rows: packed rows of ``T + 1`` tokens, or another row source
      (``rows_per_epoch`` and ``batch(indices)``: ``data.tasks``).
    global_batch: ``B``, rows per step over all processes.
    positions: which of the ``B`` rows this process reads (``process_rows``);
      None for all of them.
  """

  def __init__(self, rows: PackedRows, global_batch: int,
               positions: np.ndarray | None = None):
    self.rows, self.global_batch = rows, global_batch
    self.positions = (np.arange(global_batch) if positions is None
                      else np.asarray(positions, np.int64))

  def row_indices(self, step: int) -> np.ndarray:
    """The packed-row indices of this process's rows of step ``step`` (see
    the module docstring)."""
    per_epoch = self.rows.rows_per_epoch
    steps_per_epoch = max(per_epoch // self.global_batch, 1)
    epoch, offset = divmod(int(step), steps_per_epoch)
    return epoch * per_epoch + self.positions * steps_per_epoch + offset

  def batch(self, step: int) -> dict:
    """This process's rows of step ``step``: the row source's arrays
    (``model_inputs``, ``[len(positions), T]``, for packed rows)."""
    return self.rows.batch(self.row_indices(step))

  def dataset(self, num_steps: int) -> grain.MapDataset:
    """Element ``s`` is ``batch(s)``, for ``s < num_steps``."""
    return grain.MapDataset.source(_Steps(self, num_steps))

  def iterator(self, start_step: int, num_steps: int,
               read_ahead: int = 2):
    """Batches of steps ``start_step, ..., num_steps - 1``, read ahead by
    ``read_ahead`` steps in a background thread."""
    if not 0 <= start_step <= num_steps:
      raise ValueError(f"start_step {start_step} is not in [0, {num_steps}]")
    dataset = self.dataset(num_steps)[start_step:]
    return iter(dataset.to_iter_dataset(grain.ReadOptions(
        num_threads=1, prefetch_buffer_size=read_ahead)))


class _Steps:
  """A random-access grain source: element ``s`` is the batch of step
  ``s``."""

  def __init__(self, source: BatchSource, num_steps: int):
    self.source, self.num_steps = source, num_steps

  def __len__(self) -> int:
    return self.num_steps

  def __getitem__(self, step: int) -> dict:
    return self.source.batch(int(step))


def global_batch_to_device(local: dict, positions: np.ndarray,
                           mesh: jax.sharding.Mesh,
                           global_batch: int) -> dict:
  """Global arrays ``[B, T, ...]`` sharded as ``batch_sharding(mesh)`` (and
  ``[B]`` arrays over the batch axes alone) from this process's rows
  ``local`` (at ``positions`` of the global batch)."""
  where = {int(p): i for i, p in enumerate(positions)}
  out = {}
  for name, value in local.items():
    value = np.asarray(value)
    shape = (global_batch,) + value.shape[1:]
    sharding = (shd.batch_sharding(mesh, value.ndim) if value.ndim >= 2
                else jax.sharding.NamedSharding(
                    mesh, jax.sharding.PartitionSpec(shd.BATCH_AXES)))

    def part(index, value=value):
      rows = range(*index[0].indices(global_batch))
      return value[[where[r] for r in rows]][(slice(None),) + index[1:]]

    out[name] = jax.make_array_from_callback(shape, sharding, part)
  return out
