"""``experiments.generate`` with text: the converted fixtures' tokenizer,
batched prompts of different lengths, stop strings and eos, and the
training setup's tokenizer check."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import config_flags
from experiments import convert as convert_command
from experiments import generate
from experiments import train_setup
from experiments.configs import tiny
from lin_attn_jax import convert
from lin_attn_jax.data import ByteTokenizer, HFTokenizer
from tests.convert.test_convert import FIXTURES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PROMPTS = ["def main(", "import os\n", "x"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  work = str(tmp_path_factory.mktemp("generate") / "gla")
  convert_command.convert(os.path.join(FIXTURES, "gla"), work)
  return work


def test_converted_fixture_keeps_its_tokenizer(workdir):
  lm, _, _, tokenizer = convert.load_pretrained(
      os.path.join(FIXTURES, "gla"), with_tokenizer=True)
  assert isinstance(tokenizer, HFTokenizer)
  # Special ids from the checkpoint's config.json (kept as hf_config.json).
  assert (tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id) == (
      64, 1, 2)
  copied = generate.load_tokenizer(None, workdir)
  assert (copied.vocab_size, copied.bos_id, copied.eos_id) == (64, 1, 2)
  assert copied.encode("def main(") == tokenizer.encode("def main(")
  assert isinstance(generate.load_tokenizer("bytes", workdir), ByteTokenizer)
  assert convert.checkpoint_tokenizer(os.path.join(FIXTURES, "..")) is None
  del lm


def test_batched_prompts_continue_as_alone(workdir):
  lm = generate.load_workdir(workdir)
  tokenizer = generate.load_tokenizer(None, workdir)
  together = generate.continue_prompts(lm, tokenizer, PROMPTS,
                                       max_new_tokens=10, stops=[])
  for text, out in zip(PROMPTS, together):
    assert out == generate.continue_prompts(lm, tokenizer, [text],
                                            max_new_tokens=10, stops=[])[0]
  assert any(together)
  streamed = []
  first = generate.continue_prompts(lm, tokenizer, PROMPTS[:1],
                                    max_new_tokens=10, stops=[],
                                    echo=streamed.append)
  assert "".join(streamed) == first[0] == together[0]


def test_stop_strings_and_eos(workdir):
  lm = generate.load_workdir(workdir)
  tokenizer = generate.load_tokenizer(None, workdir)
  full = generate.continue_prompts(lm, tokenizer, PROMPTS[:1],
                                   max_new_tokens=12, stops=[])[0]
  stop = full[3:5]
  cut = generate.continue_prompts(lm, tokenizer, PROMPTS[:1],
                                  max_new_tokens=12, stops=[stop])[0]
  assert cut == full[:full.index(stop)]
  # The first new token as eos: nothing is printed.
  ids = lm.generate(jax.numpy.asarray([tokenizer.encode(PROMPTS[0])]), 1)
  tokenizer.eos_id = int(ids[0, -1])
  assert generate.continue_prompts(lm, tokenizer, PROMPTS[:1],
                                   max_new_tokens=12, stops=[]) == [""]


def test_row_text_holds_back_a_possible_stop_string():
  row = generate.RowText(ByteTokenizer(), ["END"])
  pieces = [row.push(b) for b in "ab€E".encode()]
  assert "".join(pieces) == "ab€"
  assert row.push(ord("N")) == "" and not row.stopped
  assert row.push(ord("D")) == "" and row.stopped
  assert row.push(ord("z")) == "" and row.text == "ab€"
  other = generate.RowText(ByteTokenizer(), ["END"])
  assert [other.push(b) for b in b"xEN"] == ["x", "", ""]
  assert other.finish() == "EN" and other.text == "xEN"
  with pytest.raises(ValueError, match="encodes to no tokens"):
    generate.encode_prompts(ByteTokenizer(), ["a", ""], bos=False, pad_id=0)
  ids, lengths = generate.encode_prompts(ByteTokenizer(), ["ab", "c"],
                                         bos=False, pad_id=9)
  np.testing.assert_array_equal(ids, [[97, 98], [9, 99]])
  np.testing.assert_array_equal(lengths, [2, 1])


def test_generate_command_prints_text(workdir):
  done = subprocess.run(
      [sys.executable, "-m", "experiments.generate", f"--workdir={workdir}",
       "--prompt=def main(", "--max_new_tokens=8", "--nospeed"],
      capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  assert "tokenizer: HFTokenizer(vocab_size=64" in lines[0]
  lm = generate.load_workdir(workdir)
  want = generate.continue_prompts(
      lm, generate.load_tokenizer(None, workdir), ["def main("],
      max_new_tokens=8, stops=[])[0]
  assert "\n".join(lines[1:]) == "def main(" + want


def test_training_checks_the_tokenizer_vocabulary(tmp_path):
  shutil.copy(os.path.join(FIXTURES, "gla", "tokenizer.json"), tmp_path)
  base = tiny.CONFIG
  padded = dataclasses.replace(
      base, tokenizer=str(tmp_path),
      model=dataclasses.replace(base.model, vocab_size=96))
  assert train_setup.load_tokenizer(padded).vocab_size == 64
  small = dataclasses.replace(
      padded, model=dataclasses.replace(base.model, vocab_size=48))
  with pytest.raises(config_flags.FlagError,
                     match=r"^--config.model.vocab_size: .*vocab_size = 48 "
                     r".* vocabulary of 64"):
    train_setup.load_tokenizer(small)
  missing = dataclasses.replace(padded, tokenizer=str(tmp_path / "none"))
  with pytest.raises(config_flags.FlagError, match=r"^--config.tokenizer: "):
    train_setup.load_tokenizer(missing)
  assert isinstance(train_setup.load_tokenizer(base), ByteTokenizer)
