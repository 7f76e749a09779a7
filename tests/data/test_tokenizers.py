"""Tokenizers: round trips, special ids from files, vocabulary checks and
incremental decoding, with a BPE and a SentencePiece model trained on the
spot on the standard library's source."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

from lin_attn_jax.data import (ByteTokenizer, HFTokenizer, IncrementalDecoder,
                               SentencePieceTokenizer, Tokenizer, check_vocab,
                               load_tokenizer, stdlib_corpus, train_bpe)

STRINGS = ["", "plain ascii", "héllo wörld", "日本語のテキスト",
           "emoji 🙂🚀 and ZWJ 👩‍💻", "tab\tnew\n\nline\r\n",
           "  leading and  double spaces ", "e\u0301 Ελληνικά Ωμέγα",
           "def f(x):\n    return x ** 2  # ∑\n"]


@pytest.fixture(scope="module")
def texts():
  corpus = stdlib_corpus("heldout")
  return [bytes(corpus.document(i)).decode("utf-8", "replace")
          for i in range(corpus.num_documents)]


@pytest.fixture(scope="module")
def bpe_dir(texts, tmp_path_factory):
  path = tmp_path_factory.mktemp("bpe")
  train_bpe(texts, 400).save(str(path))
  return path


@pytest.fixture(scope="module")
def sentencepiece_file(texts, tmp_path_factory):
  spm = pytest.importorskip("sentencepiece")
  model = io.BytesIO()
  lines = [line for text in texts for line in text.splitlines()
           if line.strip()]
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=600,
      model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
      remove_extra_whitespaces=False, add_dummy_prefix=False,
      allow_whitespace_only_pieces=True, minloglevel=2)
  path = tmp_path_factory.mktemp("sp") / "tokenizer.model"
  path.write_bytes(model.getvalue())
  return path


def test_bytes_are_the_corpus_encoding():
  tokenizer = ByteTokenizer()
  assert isinstance(tokenizer, Tokenizer)
  assert (tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id,
          tokenizer.pad_id) == (256, None, None, None)
  corpus = stdlib_corpus("heldout")
  document = np.asarray(corpus.document(0))
  text = bytes(document).decode("utf-8")
  np.testing.assert_array_equal(tokenizer.encode(text), document)
  assert tokenizer.encode("é") == [0xC3, 0xA9]
  assert tokenizer.decode([0xC3]) == "\ufffd"
  with pytest.raises(ValueError, match="256"):
    tokenizer.decode([300])


@pytest.mark.parametrize("kind", ["bytes", "bpe", "sentencepiece"])
def test_round_trips(kind, request):
  if kind == "bytes":
    tokenizer = load_tokenizer("bytes")
  elif kind == "bpe":
    tokenizer = load_tokenizer(str(request.getfixturevalue("bpe_dir")))
  else:
    tokenizer = load_tokenizer(str(request.getfixturevalue(
        "sentencepiece_file")))
  for text in STRINGS:
    ids = tokenizer.encode(text)
    assert all(0 <= i < tokenizer.vocab_size for i in ids), text
    assert tokenizer.decode(ids) == text
  assert tokenizer.encode_batch(STRINGS) == [tokenizer.encode(s)
                                             for s in STRINGS]
  if kind != "bytes":
    # A learned vocabulary merges: fewer ids than bytes on source code.
    source = STRINGS[-1] * 4
    assert len(tokenizer.encode(source)) < 0.7 * len(source.encode())


def test_bpe_special_ids_and_kinds(bpe_dir, tmp_path):
  tokenizer = load_tokenizer(str(bpe_dir))
  assert isinstance(tokenizer, HFTokenizer)
  assert (tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id,
          tokenizer.eos_id) == (400, 0, 1, 2)
  assert tokenizer.decode([1, 2] + tokenizer.encode("ok")) == "ok"
  # Ids from config.json fill what tokenizer_config.json leaves unset.
  folder = tmp_path / "checkpoint"
  shutil.copytree(bpe_dir, folder)
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {"eos_token": "</s>", "pad_token": {"content": "<s>"}}))
  (folder / "config.json").write_text(json.dumps(
      {"bos_token_id": 1, "eos_token_id": 7, "pad_token_id": None}))
  tokenizer = load_tokenizer(str(folder))
  assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (1, 2, 1)
  alone = load_tokenizer(str(folder / "tokenizer.json"))
  assert isinstance(alone, HFTokenizer) and alone.eos_id == 2
  (folder / "tokenizer_config.json").unlink()
  (folder / "config.json").unlink()
  alone = load_tokenizer(str(folder))
  assert (alone.bos_id, alone.eos_id, alone.pad_id) == (None, None, None)
  (folder / "config.json").write_text(json.dumps({"bos_token_id": -3}))
  with pytest.raises(ValueError, match="bos_token_id"):
    load_tokenizer(str(folder))


def test_load_tokenizer_picks_by_file(bpe_dir, sentencepiece_file, tmp_path):
  assert isinstance(load_tokenizer(None), ByteTokenizer)
  spm_dir = sentencepiece_file.parent
  tokenizer = load_tokenizer(str(spm_dir))
  assert isinstance(tokenizer, SentencePieceTokenizer)
  assert (tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id,
          tokenizer.pad_id) == (600, 1, 2, None)
  # tokenizer.json wins over a .model in the same folder.
  both = tmp_path / "both"
  shutil.copytree(bpe_dir, both)
  shutil.copy(sentencepiece_file, both / "spiece.model")
  assert isinstance(load_tokenizer(str(both)), HFTokenizer)
  (both / "tokenizer.json").unlink()
  assert isinstance(load_tokenizer(str(both)), SentencePieceTokenizer)
  shutil.copy(sentencepiece_file, both / "other.model")
  with pytest.raises(ValueError, match="several .model"):
    load_tokenizer(str(both))
  with pytest.raises(ValueError, match="holds no tokenizer"):
    load_tokenizer(str(tmp_path / "both" / ".."))
  with pytest.raises(ValueError, match="neither"):
    load_tokenizer(str(tmp_path / "missing"))
  (tmp_path / "vocab.txt").write_text("a\n")
  with pytest.raises(ValueError, match="tokenizer files are"):
    load_tokenizer(str(tmp_path / "vocab.txt"))


def test_check_vocab(bpe_dir):
  tokenizer = load_tokenizer(str(bpe_dir))
  check_vocab(tokenizer, 400)
  check_vocab(tokenizer, 512)
  with pytest.raises(ValueError, match=r"vocab_size = 399 .* 400"):
    check_vocab(tokenizer, 399)
  check_vocab(ByteTokenizer(), 256)
  with pytest.raises(ValueError, match=r"vocab_size = 255 .* 256"):
    check_vocab(ByteTokenizer(), 255)


def test_small_alphabet_bpe_fits_a_small_vocabulary(texts):
  tokenizer = train_bpe(texts, 64, limit_alphabet=40)
  assert tokenizer.vocab_size <= 64
  text = "def f(x):\n    return x\n"
  assert tokenizer.decode(tokenizer.encode(text)) == text
  with pytest.raises(ValueError, match="limit_alphabet"):
    train_bpe(texts, 64)


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_incremental_decoding_never_breaks_a_character(kind, bpe_dir):
  tokenizer = (ByteTokenizer() if kind == "bytes"
               else load_tokenizer(str(bpe_dir)))
  text = "naïve 日本 🙂 done"
  decoder = IncrementalDecoder(tokenizer)
  pieces = [decoder.push([i]) for i in tokenizer.encode(text)]
  pieces.append(decoder.flush())
  assert "".join(pieces) == text
  assert not any("\ufffd" in piece for piece in pieces)
  if kind == "bytes":
    # The four bytes of the emoji arrive one by one; it prints once whole.
    assert "🙂" in pieces and pieces.count("") >= 3
  truncated = IncrementalDecoder(ByteTokenizer())
  assert truncated.push([0xF0, 0x9F]) == ""
  assert truncated.flush() == "\ufffd"
