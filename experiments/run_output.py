"""What a training run shows and leaves behind: the progress bar or log
lines, TensorBoard events, and the loss plot.

- ``Console``: process 0's output. On a terminal, one progress line
  redrawn in place (step, bar, loss, tokens/s, ETA) with messages printed
  above it; elsewhere (a file, a pipe, CI), a plain line every
  ``log_every`` steps.
- ``EventWriter``: TensorBoard event files through ``tensorboardX`` (the
  ``tensorboard`` extra) when it is installed; otherwise nothing.
- ``plot_losses``: train and held-out loss (bits per token) against tokens
  from ``metrics.jsonl``, as a PNG (matplotlib, the ``analysis`` extra).
"""

from __future__ import annotations

import collections
import json
import math
import shutil
import sys
import time
from typing import TextIO

BITS_PER_NAT = 1 / math.log(2)


def duration(seconds: float) -> str:
  seconds = max(int(round(seconds)), 0)
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  return (f"{hours}:{minutes:02d}:{seconds:02d}" if hours
          else f"{minutes}:{seconds:02d}")


def _rate(tokens_per_second: float) -> str:
  if tokens_per_second >= 1e6:
    return f"{tokens_per_second / 1e6:.2f}M"
  if tokens_per_second >= 1e3:
    return f"{tokens_per_second / 1e3:.1f}k"
  return f"{tokens_per_second:.0f}"


class Console:
  """Progress and messages of one run (silent on processes other than 0).

  Args:
    total_steps: the run's last step.
    start_step: the step it starts (or resumes) from.
    tokens_per_step: for tokens/s.
    mode: ``"bar"``, ``"lines"`` or ``"auto"`` (a bar when ``stream`` is a
      terminal).
    log_every: steps between plain lines.
    enabled: False on processes other than 0.
  """

  def __init__(self, total_steps: int, start_step: int, tokens_per_step: int,
               *, mode: str = "auto", log_every: int = 10,
               stream: TextIO | None = None, enabled: bool = True):
    self.stream = stream or sys.stdout
    self.enabled = enabled
    self.bar = (self.stream.isatty() if mode == "auto" else mode == "bar")
    self.total, self.start = total_steps, start_step
    self.tokens_per_step = tokens_per_step
    self.log_every = max(int(log_every), 1)
    # Seconds of recent steps (the first step of a process compiles and is
    # left out of the rate and the ETA).
    self.recent = collections.deque(maxlen=50)
    self.steps_seen = 0
    self.last_draw = 0.0
    self.line_shown = False
    self.last: dict = {}

  def message(self, text: str) -> None:
    """A line above the progress bar (or between log lines)."""
    if not self.enabled:
      return
    if self.bar and self.line_shown:
      self.stream.write("\r\033[K")
    self.stream.write(text + "\n")
    if self.bar and self.line_shown:
      self.stream.write(self._line())
    self.stream.flush()

  def step(self, record: dict) -> None:
    """Called with every step's metrics (``step``, ``loss``, ``seconds``)."""
    self.steps_seen += 1
    if self.steps_seen > 1:
      self.recent.append(record["seconds"])
    self.last = record
    if not self.enabled:
      return
    step = record["step"]
    now = time.monotonic()
    if self.bar:
      if now - self.last_draw >= 0.1 or step == self.total:
        self.stream.write("\r\033[K" + self._line())
        self.stream.flush()
        self.line_shown = True
        self.last_draw = now
    elif step % self.log_every == 0 or step == self.total or \
        self.steps_seen == 1:
      self.stream.write(self._line() + "\n")
      self.stream.flush()

  def tokens_per_second(self) -> float | None:
    if not self.recent:
      return None
    return self.tokens_per_step * len(self.recent) / sum(self.recent)

  def eta_seconds(self) -> float | None:
    if not self.recent:
      return None
    per_step = sorted(self.recent)[len(self.recent) // 2]
    return per_step * (self.total - self.last.get("step", self.start))

  def _line(self) -> str:
    step = self.last.get("step", self.start)
    rate, eta = self.tokens_per_second(), self.eta_seconds()
    fields = [f"loss {self.last['loss']:.3f}" if "loss" in self.last else "",
              f"{_rate(rate)} tok/s" if rate else "compiling",
              f"ETA {duration(eta)}" if eta is not None else ""]
    tail = " | ".join(f for f in fields if f)
    head = f"step {step}/{self.total}"
    if not self.bar:
      return f"{head} | {tail}"
    width = shutil.get_terminal_size((100, 20)).columns
    room = width - len(head) - len(tail) - 12
    if room < 10:
      return f"{head} | {tail}"[:width - 1]
    done = min(max(step / max(self.total, 1), 0.0), 1.0)
    filled = int(room * done)
    bar = "#" * filled + "-" * (room - filled)
    return f"{head} [{bar}] {done:4.0%} | {tail}"

  def close(self) -> None:
    if self.enabled and self.bar and self.line_shown:
      self.stream.write("\n")
      self.stream.flush()
      self.line_shown = False


class EventWriter:
  """TensorBoard scalars and text in ``directory`` (process 0), when
  ``tensorboardX`` is installed; ``available`` says whether it is."""

  SCALARS = {"loss": "train/loss", "grad_norm": "train/grad_norm",
             "learning_rate": "train/learning_rate",
             "tokens_per_second": "train/tokens_per_second",
             "eval_loss": "heldout/loss",
             "eval_bits_per_token": "heldout/bits_per_token",
             "eval_bits_per_byte": "heldout/bits_per_byte"}

  def __init__(self, directory: str, enabled: bool = True):
    self.directory = directory
    self.writer = None
    self.available = False
    if not enabled:
      return
    try:
      from tensorboardX import SummaryWriter
    except ImportError:
      return
    self.available = True
    self.writer = SummaryWriter(logdir=directory)

  def write(self, record: dict) -> None:
    if self.writer is None:
      return
    for key, tag in self.SCALARS.items():
      value = record.get(key)
      if value is not None:
        self.writer.add_scalar(tag, value, record["step"])

  def text(self, tag: str, text: str, step: int) -> None:
    if self.writer is not None:
      self.writer.add_text(tag, text, step)

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()


def read_metrics(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def loss_curves(records: list[dict], tokens_per_step: int):
  """``(train, heldout)``: lists of ``(tokens, bits per token)``."""
  train = [(r["step"] * tokens_per_step, r["loss"] * BITS_PER_NAT)
           for r in records if "loss" in r]
  held = [(r["step"] * tokens_per_step, r["eval_bits_per_token"])
          for r in records if "eval_bits_per_token" in r]
  return train, held


def smoothed(values: list[float], window: int) -> list[float]:
  """Trailing mean over ``window`` values."""
  out, total = [], 0.0
  for i, value in enumerate(values):
    total += value
    if i >= window:
      total -= values[i - window]
    out.append(total / min(i + 1, window))
  return out


def matplotlib_pyplot():
  """``matplotlib.pyplot`` with the Agg backend, or None when matplotlib is
  not installed."""
  try:
    import matplotlib
  except ImportError:
    return None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def plot_losses(metrics_path: str, out_path: str, tokens_per_step: int,
                title: str, unit: str = "bits per token") -> bool:
  """Draws train and held-out loss against tokens; False when matplotlib
  is missing."""
  plt = matplotlib_pyplot()
  if plt is None:
    return False
  train, held = loss_curves(read_metrics(metrics_path), tokens_per_step)
  fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
  if train:
    x, y = zip(*train)
    ax.plot(x, y, color="tab:blue", alpha=0.25, linewidth=0.8)
    ax.plot(x, smoothed(list(y), max(len(y) // 50, 1)), color="tab:blue",
            label="train (smoothed)")
  if held:
    x, y = zip(*held)
    ax.plot(x, y, "o-", color="tab:orange", label="held-out")
  ax.set_xlabel("tokens")
  ax.set_ylabel(unit)
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(out_path)
  plt.close(fig)
  return True
