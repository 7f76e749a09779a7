"""Continues a prompt with an LM and reports the decoding speed.

Tokens are bytes (vocab 256), so any text is a prompt and any continuation
prints. The model is ``MODEL`` with the ``--config.model.<field>=VALUE``
overrides (``experiments/config_flags.py``). Without --checkpoint the
weights are random (the continuation is noise, the speed is real); with
one, its parameters are restored into that model (it must have been saved
from the same config).

  python -m experiments.generate --config.model.mixer=gla \
      --max_new_tokens=64
  python -m experiments.generate \
      --config.model.mixer=gla,gla,gla,softmax_attn \
      --config.model.n_layers=8 --temperature=0.8 --top_p=0.9 \
      --checkpoint=/path/ckpt
  python -m experiments.generate --workdir=WORKDIR   # from convert.py

With --workdir the model is the one of ``WORKDIR/config.json`` (a
``--config.model`` override is an error) and its parameters
``WORKDIR/params``; the prompt's bytes are its token ids (taken modulo the
vocabulary) and the continuation prints as token ids unless the vocabulary
is bytes.
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
flags.DEFINE_string("prompt", "The state of a linear recurrence ",
                    "Prompt text (UTF-8 bytes are the tokens).")
flags.DEFINE_integer("batch_size", 1, "Rows decoded together (the prompt "
                     "is repeated).")
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
  prompt = np.frombuffer(FLAGS.prompt.encode("utf-8"),
                         np.uint8).astype(np.int64) % config.vocab_size
  prompt = jnp.asarray(np.tile(prompt, (FLAGS.batch_size, 1)), jnp.int32)
  kw = dict(temperature=FLAGS.temperature, top_k=FLAGS.top_k,
            top_p=FLAGS.top_p, rng=jax.random.key(FLAGS.seed))

  def run(n):
    return lm.generate(prompt, n, **kw)

  # Compile both programs, then time them; the difference between n new
  # tokens and one new token is the decoding alone (the prefill cancels).
  _, compile_n = _timed(lambda: run(FLAGS.max_new_tokens))
  _timed(lambda: run(1))
  out, time_n = _timed(lambda: run(FLAGS.max_new_tokens))
  _, time_1 = _timed(lambda: run(1))
  decoded = FLAGS.batch_size * (FLAGS.max_new_tokens - 1)
  if config.vocab_size == 256:
    text = repr(bytes(np.asarray(out[0], np.uint8).tolist()).decode(
        "utf-8", "replace"))
  else:
    text = str(np.asarray(out[0]).tolist())
  print(f"mixers: {', '.join(config.layer_mixers)}; "
        f"weights: {FLAGS.workdir or FLAGS.checkpoint or 'random'}")
  print(f"text: {text}")
  print(f"compile + first run: {compile_n:.1f} s; prefill of "
        f"{prompt.shape[1]} tokens + 1 token: {time_1 * 1e3:.1f} ms")
  if FLAGS.max_new_tokens > 1:
    rate = decoded / max(time_n - time_1, 1e-9)
    print(f"decoding: {rate:.0f} tokens/s ({FLAGS.batch_size} rows, "
          f"{FLAGS.max_new_tokens - 1} steps)")


if __name__ == "__main__":
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES, PREFIX))
