"""Converts a HuggingFace-format checkpoint into a workdir of the project.

  python -m experiments.convert --from=/path/to/hf_checkpoint --to=WORKDIR

The checkpoint is a local directory with ``config.json`` and safetensors
weights (sharded ones included); nothing is downloaded. Supported
architectures: ``lin_attn_jax.convert.SUPPORTED``. WORKDIR (new) receives

- ``config.json``: the ``LMConfig`` (``LMConfig.to_dict``);
- ``hf_config.json``: the source config, for exporting back;
- ``params/``: the parameters, ``lin_attn_jax.models.checkpoints.save_params``;
- the checkpoint's tokenizer files when it has them (``tokenizer.json`` or
  a SentencePiece ``.model``, with ``tokenizer_config.json`` and
  ``special_tokens_map.json``), checked against its vocabulary.

``python -m experiments.generate --workdir=WORKDIR`` continues a prompt with it.
Every tensor is checked before anything is written; on bad input the error
names the tensor and both shapes and WORKDIR is not created.
"""

from __future__ import annotations

import json
import os
import shutil

from absl import app, flags
import jax.numpy as jnp

from lin_attn_jax.convert import load_pretrained
from lin_attn_jax.data import tokenizers
from lin_attn_jax.models.checkpoints import save_params

FLAGS = flags.FLAGS
flags.DEFINE_string("from", None, "HuggingFace checkpoint directory.")
flags.DEFINE_string("to", None, "Workdir to create.")
flags.DEFINE_enum("param_dtype", "float32", ["float32", "bfloat16"],
                  "Dtype of the stored parameters.")


def convert(source: str, workdir: str, param_dtype=None) -> None:
  """Writes the workdir of ``source``; nothing is written on error."""
  workdir = os.path.abspath(workdir)
  if os.path.exists(workdir):
    raise ValueError(f"{workdir} exists; convert writes a new workdir")
  # The tokenizer is loaded to check it against the vocabulary; its files
  # are copied below.
  lm, config, hf, _ = load_pretrained(source, param_dtype=param_dtype,
                                      with_tokenizer=True)
  partial = f"{workdir}.partial-{os.getpid()}"
  os.makedirs(partial)
  try:
    with open(os.path.join(partial, "config.json"), "w") as f:
      json.dump(config.to_dict(), f, indent=2)
    with open(os.path.join(partial, "hf_config.json"), "w") as f:
      json.dump(hf, f, indent=2)
    save_params(os.path.join(partial, "params"), lm)
    for path in tokenizers.tokenizer_files(source):
      shutil.copy(path, partial)
    os.rename(partial, workdir)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise


def main(argv):
  del argv
  if not FLAGS["from"].value or not FLAGS.to:
    raise app.UsageError("--from and --to are required")
  convert(FLAGS["from"].value, FLAGS.to,
          None if FLAGS.param_dtype == "float32" else jnp.bfloat16)
  print(f"wrote {FLAGS.to}")


if __name__ == "__main__":
  app.run(main)
