"""The settings of a training run (everything but the model's shape)."""

from __future__ import annotations

import dataclasses

from lin_attn_jax.ops.common import checks


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimizer, schedule, batch and checkpoint settings of a run."""

  # Seeds the parameters and the data order.
  seed: int = 0
  # Rows per step over all devices and processes (B).
  batch_size: int = 8
  # Tokens per row (T); rows hold T + 1 tokens for the shifted targets.
  seq_len: int = 256
  # Optimizer steps of the run (the cosine decay ends here).
  steps: int = 1000
  # Micro-batches per step: the batch is split into this many parts whose
  # gradients are summed before one update (same result, less memory).
  grad_accum: int = 1
  # Peak learning rate, reached after warmup_steps of linear warmup.
  learning_rate: float = 3e-3
  # Linear warmup from 0 to learning_rate.
  warmup_steps: int = 100
  # The cosine decay ends at learning_rate * min_lr_ratio.
  min_lr_ratio: float = 0.1
  # AdamW moments and epsilon.
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  # Decoupled weight decay, applied only where weight_decay_mask says.
  weight_decay: float = 0.1
  # Gradients are scaled to at most this global norm (0 turns it off).
  clip_norm: float = 1.0
  # Coefficient of the z-loss, mean(logsumexp(logits)^2) (0 turns it off).
  z_loss: float = 0.0
  # Coefficient of the mixture-of-experts load-balancing loss (the LM's
  # aux["load_balancing_loss"]) added to the mean cross-entropy (0: off).
  router_aux_loss_coef: float = 0.0
  # Auxiliary-loss-free balancing: after every step each MoE layer's
  # selection bias moves by this rate times sign(mean load - load) (0: off).
  router_bias_rate: float = 0.0
  # Keep this many checkpoints; save every checkpoint_every steps and at the
  # end (0 saves only at the end).
  checkpoint_keep: int = 3
  checkpoint_every: int = 100
  # Write checkpoints in a background thread.
  async_checkpoints: bool = True

  def __post_init__(self):
    for name in ("batch_size", "seq_len", "steps", "grad_accum",
                 "checkpoint_keep"):
      checks.positive_int(name, getattr(self, name))
    for name in ("warmup_steps", "checkpoint_every"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if self.batch_size % self.grad_accum:
      raise ValueError(f"batch_size {self.batch_size} is not divisible by "
                       f"grad_accum {self.grad_accum}")
    for name in ("learning_rate", "weight_decay", "clip_norm", "z_loss",
                 "eps", "router_aux_loss_coef", "router_bias_rate"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
    if not 0 <= self.min_lr_ratio <= 1:
      raise ValueError(f"min_lr_ratio must be in [0, 1], got "
                       f"{self.min_lr_ratio}")
    for name in ("b1", "b2"):
      if not 0 <= getattr(self, name) < 1:
        raise ValueError(f"{name} must be in [0, 1), got "
                         f"{getattr(self, name)}")

  @property
  def tokens_per_step(self) -> int:
    return self.batch_size * self.seq_len

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, values: dict) -> "TrainConfig":
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"unknown TrainConfig fields {unknown}")
    return cls(**values)
