"""Data for training and experiments: corpora, packing into rows, batches.

- ``corpus``: documents as token arrays (the Python standard library's own
  source files by default, text files, pre-tokenized token files);
- ``sources``: corpora from jsonl, parquet and ArrayRecord shards, with
  errors naming the file and record;
- ``packing``: documents packed into fixed-length rows with segment ids, a
  pure function of (seed, row index);
- ``pipeline``: per-process batches for a step, as a grain dataset, and
  their placement on a device mesh;
- ``mqar``: Zoology's multi-query associative recall task (numpy);
- ``tokenizers``: one ``Tokenizer`` interface over bytes (the default),
  Hugging Face ``tokenizer.json`` and SentencePiece models, and the bytes
  of text each token id stands for (``token_bytes``).
"""

from lin_attn_jax.data.corpus import (Corpus, stdlib_corpus, text_corpus,
                                      token_file_corpus)
from lin_attn_jax.data.packing import PackedRows, model_inputs
from lin_attn_jax.data.sources import (array_record_corpus, jsonl_corpus,
                                       parquet_corpus)
from lin_attn_jax.data.pipeline import BatchSource, global_batch_to_device
from lin_attn_jax.data.tokenizers import (ByteTokenizer, HFTokenizer,
                                          IncrementalDecoder,
                                          SentencePieceTokenizer, Tokenizer,
                                          check_vocab, load_tokenizer,
                                          token_bytes, train_bpe)

__all__ = [
    "BatchSource",
    "ByteTokenizer",
    "Corpus",
    "HFTokenizer",
    "IncrementalDecoder",
    "PackedRows",
    "SentencePieceTokenizer",
    "Tokenizer",
    "array_record_corpus",
    "check_vocab",
    "global_batch_to_device",
    "jsonl_corpus",
    "load_tokenizer",
    "model_inputs",
    "parquet_corpus",
    "stdlib_corpus",
    "text_corpus",
    "token_bytes",
    "token_file_corpus",
    "train_bpe",
]
