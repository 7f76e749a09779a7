"""Checkpoints of a training run: orbax ``CheckpointManager`` in a work
directory.

Each checkpoint is a step directory ``<workdir>/checkpoints/<step>/``
holding three items:

- ``state``: the ``TrainState`` (parameters, optimizer state, step), every
  array written by the processes that hold its shards;
- ``data``: the data position (a batch is a pure function of the step, so
  the step, seed, batch shape and corpus fingerprint are all it needs);
- ``config``: the model and training configs, checked on restore.

Saving is asynchronous (a background thread writes while training goes
on) and atomic: orbax writes into a temporary directory and renames it
when every item is complete, so a run killed mid-save leaves the previous
checkpoint as the latest. Restoring takes the target shardings, so a
checkpoint saved on one mesh restores onto any other. A checkpoint that
cannot be read is moved aside (renamed ``unreadable-<step>``) with a log
line and the one before it is used.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

ITEMS = ("state", "data", "config")


class Checkpointer:
  """Saves and restores a run's checkpoints under ``directory``.

  Args:
    directory: the checkpoint directory (created on the first save); a
      local path or a URL that orbax writes to (``gs://bucket/path``).
    keep: how many checkpoints to keep (the newest).
    every: save when ``step % every == 0`` (``maybe_save``); 0 never
      (only forced saves).
    async_save: write in a background thread.
    log: where progress lines go (default ``absl.logging.info``).
  """

  def __init__(self, directory: str, *, keep: int = 3, every: int = 0,
               async_save: bool = True,
               log: Callable[[str], Any] | None = None):
    # A URL (gs://bucket/path) goes to orbax as it is.
    self.directory = (directory if "://" in directory
                      else os.path.abspath(directory))
    self.every = every
    self.log = log or logging.info
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True,
        enable_async_checkpointing=async_save,
        cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=ITEMS)

  def steps(self) -> list[int]:
    """Steps of the complete checkpoints, oldest first."""
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def stored_config(self, step: int) -> dict:
    return self.manager.restore(step, args=ocp.args.Composite(
        config=ocp.args.JsonRestore())).config

  def save(self, step: int, state, data: dict, config: dict,
           force: bool = True) -> bool:
    """Starts writing a checkpoint of ``state`` at ``step``; returns
    whether one was started."""
    if step in self.manager.all_steps():
      return False
    if not force and not (self.every and step % self.every == 0):
      return False
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data),
        config=ocp.args.JsonSave(config)), force=True)

  def maybe_save(self, step: int, state, data: dict, config: dict) -> bool:
    return self.save(step, state, data, config, force=False)

  def restore_latest(self, abstract_state, check_config:
                     Callable[[dict], None] | None = None):
    """``(state, data, step)`` from the newest readable checkpoint, or None
    when there is none.

    ``abstract_state`` gives shapes, dtypes and the target shardings
    (``jax.ShapeDtypeStruct`` leaves). ``check_config(stored)`` may raise
    ``ValueError`` for a checkpoint of another model: that is not skipped.
    """
    for step in reversed(self.steps()):
      try:
        stored = self.stored_config(step)
      except Exception as error:  # noqa: BLE001
        self._set_aside(step, error)
        continue
      if check_config is not None:
        check_config(stored)
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore()))
      except Exception as error:  # noqa: BLE001
        self._set_aside(step, error)
        continue
      return restored.state, restored.data, step
    return None

  def _set_aside(self, step: int, error: Exception) -> None:
    path = os.path.join(self.directory, str(step))
    aside = os.path.join(self.directory, f"unreadable-{step}-{int(time.time())}")
    message = str(error).splitlines()[0][:200] if str(error) else repr(error)
    self.log(f"checkpoint at step {step} ({path}) cannot be read "
             f"({type(error).__name__}: {message}); moved to {aside}, "
             "trying the one before it")
    if jax.process_index() == 0 and os.path.exists(path):
      os.rename(path, aside)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"set aside checkpoint {step}")
    self.manager.reload()

  def wait(self) -> None:
    """Blocks until the writing of every started checkpoint is finished."""
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
