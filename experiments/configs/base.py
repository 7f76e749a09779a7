"""What a training run is: the model, the optimizer and batch, the mesh,
the data and how often to evaluate and sample.

A preset is a module of this package with a ``CONFIG``; the flags of
``experiments/train.py`` override its fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from lin_attn_jax.models.lm import LMConfig
from lin_attn_jax.train import TrainConfig


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One training run's settings (everything but where it writes)."""

  # Shape and mixers of the LM.
  model: LMConfig
  # Optimizer, schedule, batch, steps and checkpoint cadence.
  train: TrainConfig
  # Mesh for sharding.make_mesh: axis=size pairs over data, fsdp, tensor,
  # sequence; one size may be -1 (the devices left).
  mesh: str = "fsdp=-1"
  # Sharding rules preset: "dp", "fsdp" or "fsdp_tp".
  rules: str = "fsdp"
  # Training text: "stdlib" (the Python standard library's source),
  # "text:GLOB[,GLOB...]" (files, one document each, byte tokens) or
  # "tokens:PATH[,dtype=uint16][,eos_id=N]" (a pre-tokenized .npy / .bin).
  data: str = "stdlib"
  # Fraction of the documents held out for evaluation (by a hash of names).
  heldout_fraction: float = 0.02
  # Held-out loss every this many steps (0: only at the end) ...
  eval_every: int = 100
  # ... over this many fixed held-out batches.
  eval_batches: int = 4
  # A greedy sample every this many steps (0: only at the end) ...
  sample_every: int = 0
  # ... of this many new tokens ...
  sample_tokens: int = 64
  # ... continuing this prompt (UTF-8 bytes; byte-token models only).
  prompt: str = "def "
  # A progress line every this many steps when stdout is not a terminal.
  log_every: int = 10

  def to_dict(self) -> dict:
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out["model"], out["train"] = self.model.to_dict(), self.train.to_dict()
    return out

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "Experiment":
    values = dict(values)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"unknown Experiment fields {unknown}")
    values["model"] = LMConfig.from_dict(values["model"])
    values["train"] = TrainConfig.from_dict(values["train"])
    return cls(**values)
