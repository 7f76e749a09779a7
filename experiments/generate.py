"""Continues prompts with an LM, prints the text as it streams, and reports
the decoding speed.

The model is ``MODEL`` with the ``--config.model.<field>=VALUE`` overrides
(``experiments/config_flags.py``), its tokenizer bytes. Without
--checkpoint the weights are random (the continuation is noise, the speed
is real); with one, its parameters are restored into that model (it must
have been saved from the same config).

  python -m experiments.generate --config.model.mixer=gla \
      --max_new_tokens=64
  python -m experiments.generate \
      --config.model.mixer=gla,gla,gla,softmax_attn \
      --config.model.n_layers=8 --temperature=0.8 --top_p=0.9 \
      --checkpoint=/path/ckpt
  python -m experiments.generate --workdir=WORKDIR \
      --prompt="def main(" --prompt="import " --stop="\n\n"

With --workdir (from ``experiments.convert``) the model is the one of
``WORKDIR/config.json`` (a ``--config.model`` override is an error), its
parameters ``WORKDIR/params`` and its tokenizer the checkpoint's files
copied there (``lin_attn_jax.data.load_tokenizer``); --tokenizer names
another (a path, or ``bytes``). Several --prompt flags (or --prompts_file,
one prompt a line) decode together, left-padded to one length, each row as
it would alone. One prompt streams its text as it is decoded; several print
when done. A row stops at the tokenizer's eos or at a --stop string (which
is cut from the text).
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import config_flags
from lin_attn_jax.data import tokenizers
from lin_attn_jax.models import LM, LMConfig
from lin_attn_jax.models.checkpoints import restore_params

# The model without --workdir; --config.model.<field>=VALUE overrides it.
MODEL = LMConfig(vocab_size=256, d_model=256, n_layers=4, n_heads=4,
                 mixer="gla")
# The model's flags: --config.model.<field>=VALUE.
PREFIX = f"{config_flags.PREFIX}.model"

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", None, "Directory written by "
                    "lin_attn_jax.models.checkpoints.save_params.")
flags.DEFINE_string("workdir", None, "Workdir of experiments.convert "
                    "(config.json and params/); its model replaces MODEL "
                    "and the --config.model.<field> overrides.")
flags.DEFINE_multi_string("prompt", ["The state of a linear recurrence "],
                          "Prompt text; repeat the flag for a batch.")
flags.DEFINE_string("prompts_file", None, "A text file of prompts, one a "
                    "line (replaces --prompt).")
flags.DEFINE_string("tokenizer", None, "A tokenizer.json, a SentencePiece "
                    ".model, a directory holding one, or 'bytes'; default: "
                    "the workdir's, else bytes.")
flags.DEFINE_multi_string("stop", [], "A string that ends a row's text "
                          "(repeatable); the text is cut before it.")
flags.DEFINE_bool("bos", False, "Start every prompt with the tokenizer's "
                  "bos id.")
flags.DEFINE_integer("batch_size", 1, "Rows decoded together: each prompt "
                     "is repeated this many times.")
flags.DEFINE_bool("speed", True, "Also time the whole generation program "
                  "(compiled twice, run twice) and report tokens/s.")
flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate.")
flags.DEFINE_float("temperature", 0.0, "0 is greedy.")
flags.DEFINE_integer("top_k", None, "Sample from the k most likely tokens.")
flags.DEFINE_float("top_p", None, "Nucleus sampling threshold.")
flags.DEFINE_integer("seed", 0, "Seed of the weights and of sampling.")


# The --config.model.<field>=VALUE arguments of the command line, by field.
OVERRIDES: dict[str, str | None] = {}


def model_config(overrides) -> LMConfig:
  """``MODEL`` with the ``{field: value}`` overrides; raises ``FlagError``
  naming the ``--config.model.<field>``."""
  return config_flags.apply_overrides(MODEL, overrides, PREFIX)


def _timed(fn):
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - start


def load_workdir(workdir: str) -> LM:
  """The LM of a workdir: ``config.json`` (``LMConfig.to_dict``) and the
  parameters in ``params/``."""
  with open(os.path.join(workdir, "config.json")) as f:
    config = LMConfig.from_dict(json.load(f))
  lm = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(lm)
  lm = nnx.merge(graphdef, jax.tree.map(
      lambda x: jnp.zeros(x.shape, x.dtype), state))
  return restore_params(os.path.join(workdir, "params"), lm)


def load_tokenizer(flag: str | None, workdir: str | None):
  """The tokenizer of --tokenizer, else of the workdir when it has one,
  else bytes."""
  if flag is None and workdir and tokenizers.tokenizer_files(workdir):
    flag = workdir
  return tokenizers.load_tokenizer(flag)


def encode_prompts(tokenizer, texts: list[str], *, bos: bool, pad_id: int):
  """``([B, P] int32 left-padded ids, [B] int32 lengths)``."""
  rows = tokenizer.encode_batch(texts)
  if bos:
    if tokenizer.bos_id is None:
      raise ValueError(f"--bos: the tokenizer has no bos id ({tokenizer!r})")
    rows = [[tokenizer.bos_id] + row for row in rows]
  empty = [text for text, row in zip(texts, rows) if not row]
  if empty:
    raise ValueError(f"prompt {empty[0]!r} encodes to no tokens")
  width = max(len(row) for row in rows)
  padded = [[pad_id] * (width - len(row)) + row for row in rows]
  return (np.asarray(padded, np.int32),
          np.asarray([len(row) for row in rows], np.int32))


class RowText:
  """The text of one row's new tokens: incremental decoding, cut at the
  first stop string; ``push`` returns what may be printed (an ending that
  begins a stop string is held back). Ids of a model vocabulary padded
  beyond the tokenizer's have no text and are dropped."""

  def __init__(self, tokenizer, stops: list[str]):
    self.decoder = tokenizers.IncrementalDecoder(tokenizer)
    self.stops = [s for s in stops if s]
    self.text = ""
    self.printed = 0
    self.stopped = False

  def push(self, token: int) -> str:
    if self.stopped or token >= self.decoder.tokenizer.vocab_size:
      return ""
    self.text += self.decoder.push([token])
    return self._release(final=False)

  def finish(self) -> str:
    if not self.stopped:
      self.text += self.decoder.flush()
    return self._release(final=True)

  def _release(self, final: bool) -> str:
    hits = [self.text.find(s) for s in self.stops]
    hits = [i for i in hits if i >= 0]
    if hits:
      self.text, self.stopped = self.text[:min(hits)], True
    hold = 0
    if not (final or self.stopped):
      hold = max((k for s in self.stops for k in range(1, len(s))
                  if self.text.endswith(s[:k])), default=0)
    end = max(self.printed, len(self.text) - hold)
    out, self.printed = self.text[self.printed:end], end
    return out


def continue_prompts(lm, tokenizer, texts: list[str], *, max_new_tokens: int,
                     stops: list[str], bos: bool = False, echo=None, **kw):
  """Each text's continuation (a list of str). ``echo(str)`` receives the
  first row's text as it streams; decoding ends when every row has met the
  eos or a stop string."""
  pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
  prompt, lengths = encode_prompts(tokenizer, texts, bos=bos, pad_id=pad_id)
  rows = [RowText(tokenizer, stops) for _ in texts]
  ended = np.zeros(len(texts), bool)
  steps = lm.stream(jnp.asarray(prompt), max_new_tokens,
                    prompt_lengths=jnp.asarray(lengths),
                    eos_id=tokenizer.eos_id, **kw)
  for tokens in steps:
    for i, token in enumerate(np.asarray(tokens).tolist()):
      if ended[i]:
        continue
      if token == tokenizer.eos_id:
        ended[i] = True
        continue
      piece = rows[i].push(token)
      ended[i] = rows[i].stopped
      if echo is not None and i == 0 and piece:
        echo(piece)
    if ended.all():
      steps.close()
      break
  tail = [row.finish() for row in rows]
  if echo is not None and tail[0]:
    echo(tail[0])
  return [row.text for row in rows]


def _echo(piece: str) -> None:
  print(piece, end="", flush=True)


def main(argv):
  config_flags.no_arguments(argv)
  if FLAGS.workdir:
    if OVERRIDES:
      config_flags.fail(str(config_flags.FlagError(
          f"{PREFIX}.{next(iter(OVERRIDES))}", "the model is --workdir's "
          f"({FLAGS.workdir}/config.json); drop the flag")))
    lm = load_workdir(FLAGS.workdir)
    config = lm.config
  else:
    try:
      config = model_config(OVERRIDES)
    except config_flags.FlagError as error:
      config_flags.fail(str(error))
    lm = LM(config, rngs=nnx.Rngs(FLAGS.seed))
    if FLAGS.checkpoint:
      restore_params(FLAGS.checkpoint, lm)
  try:
    tokenizer = load_tokenizer(FLAGS.tokenizer, FLAGS.workdir)
    tokenizers.check_vocab(tokenizer, config.vocab_size)
  except ValueError as error:
    config_flags.fail(str(config_flags.FlagError("tokenizer", str(error))))
  if FLAGS.prompts_file:
    with open(FLAGS.prompts_file, encoding="utf-8") as f:
      texts = [line.rstrip("\n") for line in f if line.strip()]
  else:
    texts = list(FLAGS.prompt)
  texts = [text for text in texts for _ in range(FLAGS.batch_size)]
  kw = dict(temperature=FLAGS.temperature, top_k=FLAGS.top_k,
            top_p=FLAGS.top_p, rng=jax.random.key(FLAGS.seed))
  print(f"mixers: {', '.join(config.layer_mixers)}; "
        f"weights: {FLAGS.workdir or FLAGS.checkpoint or 'random'}; "
        f"tokenizer: {tokenizer!r}")
  single = len(texts) == 1
  if single:
    print(texts[0], end="", flush=True)
  try:
    outputs = continue_prompts(lm, tokenizer, texts,
                               max_new_tokens=FLAGS.max_new_tokens,
                               stops=FLAGS.stop, bos=FLAGS.bos,
                               echo=_echo if single else None, **kw)
  except ValueError as error:
    config_flags.fail(str(error))
  if single:
    print()
  else:
    for i, (text, out) in enumerate(zip(texts, outputs)):
      print(f"[{i}] {text}{out}")
  if FLAGS.speed:
    report_speed(lm, tokenizer, texts, kw)


def report_speed(lm, tokenizer, texts, kw):
  """Times ``LM.generate`` (one compiled program) on the prompts."""
  pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
  prompt, lengths = encode_prompts(tokenizer, texts, bos=FLAGS.bos,
                                   pad_id=pad_id)
  prompt, lengths = jnp.asarray(prompt), jnp.asarray(lengths)

  def run(n):
    return lm.generate(prompt, n, prompt_lengths=lengths, **kw)

  # Compile both programs, then time them; the difference between n new
  # tokens and one new token is the decoding alone (the prefill cancels).
  _, compile_n = _timed(lambda: run(FLAGS.max_new_tokens))
  _timed(lambda: run(1))
  _, time_n = _timed(lambda: run(FLAGS.max_new_tokens))
  _, time_1 = _timed(lambda: run(1))
  rows = prompt.shape[0]
  print(f"compile + first run: {compile_n:.1f} s; prefill of "
        f"{prompt.shape[1]} tokens + 1 token: {time_1 * 1e3:.1f} ms")
  if FLAGS.max_new_tokens > 1:
    decoded = rows * (FLAGS.max_new_tokens - 1)
    rate = decoded / max(time_n - time_1, 1e-9)
    print(f"decoding: {rate:.0f} tokens/s ({rows} rows, "
          f"{FLAGS.max_new_tokens - 1} steps)")


if __name__ == "__main__":
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES, PREFIX))
