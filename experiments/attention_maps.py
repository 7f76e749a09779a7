r"""The token-mixing matrices of trained models, and how concentrated they are.

For every layer and head of each trained model, the exact matrix its mixer
applies to its values (``lin_attn_jax.analysis.attention_matrix``) on
windows of held-out text (the standard library's held-out split, byte
tokens, as the trainer uses), and the sparsity of its rows,

    S(a) = E|a| / sqrt(E[a^2])    (mean over the causal entries of a row)

averaged over the rows with at least ``min_keys`` entries (1 for a uniform
row, ``1 / sqrt(n)`` for a one-hot row of ``n``; smaller is more
concentrated), as in ``experiments.attention_focus``. Beside each value, the
closed form of ``experiments.attention_focus`` for random inputs of the same
kind: softmax with Gaussian scores of the head's measured spread
(``exp(-gamma^2 / 2)``, ``gamma`` the mean row standard deviation of the log
weights), identity linear attention with the head's measured score
mean/spread ratio, decayed linear attention with the head's decay (RetNet).
Mixers with data-dependent gates or the delta rule have no closed form there;
their column holds the zero-mean linear value ``sqrt(2 / pi)``, marked so.

Inputs are work directories of ``python -m experiments.train`` (their final
``config.json`` and ``params/``) or of ``python -m experiments.convert``.

Run:
  python -m experiments.attention_maps \
      --config.workdirs=runs/softmax_attn,runs/gla --config.out_dir=docs/maps
writes ``table.md`` (the table) and, with matplotlib (the
``analysis`` extra), ``maps_<label>.png`` per model and ``sparsity.png``.
"""

from __future__ import annotations

import dataclasses
import os

from absl import app
from absl import flags
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import attention_focus, config_flags, workdirs
from lin_attn_jax.analysis import attention_matrix, row_sparsity
from lin_attn_jax.data.corpus import stdlib_corpus
from lin_attn_jax.models.checkpoints import restore_params
from lin_attn_jax.models.lm import LM, LMConfig
from lin_attn_jax.ops.retention.inputs import retention_log_decay

FLAGS = flags.FLAGS
OVERRIDES: dict[str, str | None] = {}
# Mixers whose weights are normalised softmax rows, and identity-map linear
# attention (scores are the weights up to a row scale).
SOFTMAX = ("softmax_attn", "sliding_window_attn", "sparse_attn")
LINEAR = ("linear_attn",)
DECAYED = ("retnet",)


@dataclasses.dataclass(frozen=True)
class Maps:
  """One run of the analysis."""
  # Model directories (config.json + params/), from experiments.train or
  # experiments.convert.
  workdirs: tuple[str, ...] = ()
  # Names of the models in the table and figures; empty: the directories'
  # last parts.
  labels: tuple[str, ...] = ()
  # Tokens per held-out window.
  seq_len: int = 128
  # Held-out windows; the sparsity is averaged over them.
  windows: int = 4
  # Seed of the choice of windows.
  seed: int = 0
  # Rows with fewer causal entries are left out of the mean sparsity.
  min_keys: int = 8
  # Heads drawn per layer in the maps figure.
  heads_drawn: int = 4
  # Where table.md and the figures go.
  out_dir: str = "docs/attention_maps"

  def to_dict(self) -> dict:
    return config_flags.to_dict(self)

  @classmethod
  def from_dict(cls, values) -> "Maps":
    return config_flags.from_dict(cls, values)


PRESETS = {"default": Maps()}


def load_model(path: str) -> tuple[LM, LMConfig]:
  """The LM of a model directory (``config.json`` + ``params/``)."""
  if workdirs.source_kind(path) != "params":
    raise ValueError(f"{path} has no {workdirs.MODEL_CONFIG_FILE} with "
                     f"{workdirs.PARAMS_DIR}/: give a finished training "
                     "run's work directory or a converted model")
  config = LMConfig.from_dict(workdirs.read_json(
      workdirs.join(path, workdirs.MODEL_CONFIG_FILE)))
  model = LM(config, rngs=nnx.Rngs(0))
  return restore_params(workdirs.join(path, workdirs.PARAMS_DIR),
                        model), config


def heldout_windows(seq_len: int, windows: int, seed: int) -> np.ndarray:
  """``[windows, seq_len]`` int32 byte tokens, each inside one held-out
  document (documents shorter than ``seq_len`` are skipped)."""
  corpus = stdlib_corpus("heldout")
  long_enough = np.flatnonzero(corpus.lengths >= seq_len)
  rng = np.random.default_rng(seed)
  rows = []
  for doc in rng.choice(long_enough, windows, replace=False):
    start = rng.integers(0, corpus.lengths[doc] - seq_len + 1)
    rows.append(corpus.document(int(doc))[start:start + seq_len])
  return np.asarray(rows, np.int32)


def layer_matrices(model: LM, tokens) -> list[np.ndarray]:
  """``[B, H, T, T]`` per layer: each mixer's matrix on its own input (the
  normalised residual stream of the trained model)."""
  x = model.embed(jnp.asarray(tokens))
  if model.config.embed_scale is not None:
    x = x * model.config.embed_scale
  if model.embed_norm is not None:
    x = model.embed_norm(x)
  matrices = []
  for block in model.blocks:
    matrices.append(np.asarray(attention_matrix(block.mixer,
                                                block.mixer_norm(x))))
    x, _, _ = block(x, segment_ids=None, mode="parallel", cache=None)
  return matrices


def _log_weight_spread(m, min_keys):
  """Mean over rows of the standard deviation of ``log a_j`` (softmax)."""
  t = m.shape[-1]
  spreads = [np.std(np.log(np.maximum(m[..., i, :i + 1], 1e-30)), axis=-1)
             for i in range(min_keys - 1, t)]
  return np.mean(np.stack(spreads, -1), axis=(0, -1))           # [H]


def _score_ratio(m, min_keys):
  """Mean over rows of mean/std of the row's entries (linear)."""
  t = m.shape[-1]
  ratios = []
  for i in range(min_keys - 1, t):
    row = m[..., i, :i + 1]
    ratios.append(row.mean(-1) / np.maximum(row.std(-1), 1e-30))
  return np.mean(np.stack(ratios, -1), axis=(0, -1))            # [H]


def random_input_prediction(mixer: str, m, head_count: int, seq_len: int,
                            min_keys: int) -> tuple[np.ndarray, str]:
  """``([H] closed forms, what they assume)`` of ``experiments.
  attention_focus`` for a mixer's heads."""
  if mixer in SOFTMAX:
    gamma = _log_weight_spread(m, min_keys)
    return attention_focus.softmax_closed_form(gamma), "softmax, measured gamma"
  if mixer in LINEAR:
    rho = _score_ratio(m, min_keys)
    return attention_focus.linear_closed_form(rho), "linear, measured rho"
  if mixer in DECAYED:
    decay = np.exp(np.asarray(retention_log_decay(head_count)))
    return (np.array([attention_focus.decayed_linear_closed_form(d, seq_len)
                      for d in decay]), "decayed linear, head's decay")
  return (np.full(head_count, float(attention_focus.linear_closed_form(0.0))),
          "zero-mean linear (no closed form)")


def analyse(label: str, path: str, tokens, config: Maps) -> dict:
  """Matrices and per-head sparsity of one model."""
  model, lm_config = load_model(path)
  matrices = layer_matrices(model, tokens)
  layers = []
  for index, (name, m) in enumerate(zip(lm_config.layer_mixers, matrices)):
    s = row_sparsity(m, min_keys=config.min_keys)               # [B, H, T]
    measured = np.nanmean(s, axis=(0, 2))                       # [H]
    past = np.nanmean(row_sparsity(m, min_keys=config.min_keys,
                                   diagonal=False), axis=(0, 2))  # [H]
    predicted, basis = random_input_prediction(
        name, m, m.shape[1], tokens.shape[1], config.min_keys)
    layers.append(dict(layer=index, mixer=name, measured=measured, past=past,
                       predicted=predicted, basis=basis))
  return dict(label=label, path=path, matrices=matrices, layers=layers)


def table_lines(results: list[dict]) -> list[str]:
  lines = ["| model | layer | mixer | head | S measured | S without the "
           "diagonal | S random inputs | prediction |",
           "|---|---|---|---|---|---|---|---|"]
  for result in results:
    for layer in result["layers"]:
      for h, (s, past, p) in enumerate(zip(
          layer["measured"], layer["past"], layer["predicted"])):
        lines.append(f"| {result['label']} | {layer['layer']} | "
                     f"{layer['mixer']} | {h} | {s:.3f} | {past:.3f} | "
                     f"{p:.3f} | {layer['basis']} |")
  return lines


def summary_lines(results: list[dict]) -> list[str]:
  lines = ["| model | mean S, all heads | lowest head S | mean S without "
           "the diagonal | random inputs (mean) |", "|---|---|---|---|---|"]
  for result in results:
    measured, past, predicted = (
        np.concatenate([l[key] for l in result["layers"]])
        for key in ("measured", "past", "predicted"))
    lines.append(f"| {result['label']} | {measured.mean():.3f} | "
                 f"{measured.min():.3f} | {past.mean():.3f} | "
                 f"{predicted.mean():.3f} |")
  return lines


def draw_maps(result: dict, path: str, heads_drawn: int) -> None:
  """Row-normalised ``|M|`` of the first window, layers by heads."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  matrices = result["matrices"]
  heads = min(heads_drawn, max(m.shape[1] for m in matrices))
  fig, axes = plt.subplots(len(matrices), heads, squeeze=False,
                           figsize=(2.2 * heads, 2.2 * len(matrices)))
  for i, m in enumerate(matrices):
    for h in range(heads):
      ax = axes[i, h]
      ax.set_xticks([])
      ax.set_yticks([])
      if h >= m.shape[1]:
        ax.axis("off")
        continue
      a = np.abs(m[0, h])
      a = a / np.maximum(a.max(-1, keepdims=True), 1e-30)
      ax.imshow(a, cmap="magma", vmin=0, vmax=1)
      ax.set_title(f"layer {i} head {h}", fontsize=7)
  fig.suptitle(f"{result['label']}: |M| / row max", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def draw_sparsity(results: list[dict], path: str) -> None:
  """Measured S per head beside the random-input prediction, per model."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(1.2 * len(results) + 3, 3.5))
  for x, result in enumerate(results):
    measured = np.concatenate([l["measured"] for l in result["layers"]])
    predicted = np.concatenate([l["predicted"] for l in result["layers"]])
    jitter = np.linspace(-0.15, 0.15, len(measured))
    ax.scatter(x + jitter, measured, s=12, color="C0",
               label="trained heads" if x == 0 else None)
    past = np.concatenate([l["past"] for l in result["layers"]])
    ax.scatter(x + jitter, past, s=12, marker="^", color="C2",
               label="trained, without the diagonal" if x == 0 else None)
    ax.scatter(x + jitter, predicted, s=12, marker="x", color="C3",
               label="random inputs" if x == 0 else None)
  ax.set_xticks(range(len(results)), [r["label"] for r in results],
                rotation=20)
  ax.set_ylabel("row sparsity S (lower: more concentrated)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def run(config: Maps, command: str) -> list[dict]:
  """Analyses every model of ``config`` and writes the report and figures."""
  if not config.workdirs:
    config_flags.fail("--config.workdirs: give at least one model directory")
  labels = config.labels or tuple(os.path.basename(os.path.normpath(p))
                                  for p in config.workdirs)
  if len(labels) != len(config.workdirs):
    config_flags.fail("--config.labels: one label per work directory")
  tokens = heldout_windows(config.seq_len, config.windows, config.seed)
  results = [analyse(label, path, tokens, config)
             for label, path in zip(labels, config.workdirs)]
  os.makedirs(config.out_dir, exist_ok=True)
  figures = []
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    matplotlib = None
  if matplotlib is not None:
    for result in results:
      name = f"maps_{result['label']}.png"
      draw_maps(result, os.path.join(config.out_dir, name),
                config.heads_drawn)
      figures.append(name)
    draw_sparsity(results, os.path.join(config.out_dir, "sparsity.png"))
    figures.append("sparsity.png")
  lines = ["# Sparsity of trained token-mixing matrices", "",
           f"Command: `{command}`", "",
           f"{config.windows} held-out windows of {config.seq_len} bytes; "
           f"rows with at least {config.min_keys} keys.", "",
           *summary_lines(results), "", *table_lines(results), ""]
  lines += [f"![{name}]({name})" for name in figures]
  with open(os.path.join(config.out_dir, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  return results


def main(argv):
  config = config_flags.command_config(argv, PRESETS, FLAGS.config, OVERRIDES)
  command = "python -m experiments.attention_maps " + " ".join(
      f"--config.{k}={v}" for k, v in OVERRIDES.items())
  for result in run(config, command):
    for layer in result["layers"]:
      print(f"{result['label']} layer {layer['layer']} {layer['mixer']}: S "
            f"{np.round(layer['measured'], 3).tolist()} random "
            f"{np.round(layer['predicted'], 3).tolist()}")


if __name__ == "__main__":
  flags.DEFINE_string("config", "default", "Preset: " + ", ".join(PRESETS))
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES))
