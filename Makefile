PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make run` trains in a new directory under runs/ every time;
# `make run WORKDIR=runs/<name>` resumes (or re-evaluates) that run.
WORKDIR ?= runs/$(shell date +%Y%m%d-%H%M%S)
# XLA:CPU allocates each execution's scratch memory afresh, and the kernel
# faults it in page by page on first touch (a third of an LM training
# step's time on CPU). glibc >= 2.35 then backs malloc's large blocks with
# transparent huge pages, 512 times fewer faults; older glibc ignores it.
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

.PHONY: run run-bpe verify test bench docs compile-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) setup.cfg pyproject.toml constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,analysis,tensorboard,parquet,tokenizers,sentencepiece]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m experiments.train --workdir=$(WORKDIR) --compilation_cache=runs/.xla_cache

# `make run-bpe`: the same tiny model and corpus with a byte-level BPE of
# BPE_VOCAB ids trained here: the standard library written as jsonl shards
# and the BPE (BPE_DATA/jsonl, BPE_DATA/tokenizer; kept by a rerun), token
# shards (BPE_DATA/tokens; resumed by a rerun), then training. Held-out
# bits per byte are comparable with `make run`'s.
BPE_VOCAB ?= 1024
BPE_DATA ?= runs/stdlib-bpe-$(BPE_VOCAB)

run-bpe: $(STAMP)
	$(PY) -m experiments.stdlib_jsonl --config.out_dir=$(BPE_DATA) --config.vocab_size=$(BPE_VOCAB)
	$(PY) -m experiments.tokenize --config.data='jsonl:$(BPE_DATA)/jsonl/*.jsonl' \
	    --config.tokenizer=$(BPE_DATA)/tokenizer --config.out_dir=$(BPE_DATA)/tokens --config.workers=2
	$(PY) -m experiments.train --workdir=$(WORKDIR) --compilation_cache=runs/.xla_cache \
	    --config.data='arrayrecord:$(BPE_DATA)/tokens/*.array_record,dtype=uint16' \
	    --config.tokenizer=$(BPE_DATA)/tokenizer --config.model.vocab_size=$(BPE_VOCAB)

verify: $(STAMP)
	$(PY) -m experiments.verify_forms

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

bench: $(STAMP)
	$(PY) -m experiments.bench_forms

# The documentation site (docs/, mkdocs.yml) in build/site; --strict fails
# on a broken link, a missing anchor or any other warning.
DOCS_STAMP := $(VENV)/.installed-docs

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[docs]'
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir build/site

# Deviceless compile checks of the Pallas kernels (TPU through libtpu, GPU
# through jax-cuda12-plugin and ptxas), each toolchain in its own virtual
# environment; writes benchmarks/RESULTS_compile.md and fails if a kernel
# does not compile, overflows VMEM or shared memory, or spills on GPU.
VENV_TPU := .venv-tpu
VENV_CUDA := .venv-cuda
COMPILE_OUT := build/compile
TOOLCHAIN_PIP = -m pip install --quiet --disable-pip-version-check -c constraints.txt -c constraints-compile.txt

$(VENV_TPU)/.installed: constraints.txt constraints-compile.txt
	$(PYTHON) -m venv $(VENV_TPU)
	$(VENV_TPU)/bin/python $(TOOLCHAIN_PIP) 'jax[tpu]' flatbuffers absl-py pytest
	touch $@

$(VENV_CUDA)/.installed: constraints.txt constraints-compile.txt
	$(PYTHON) -m venv $(VENV_CUDA)
	$(VENV_CUDA)/bin/python $(TOOLCHAIN_PIP) jax jax-cuda12-plugin jax-cuda12-pjrt nvidia-cuda-nvcc-cu12 absl-py pytest
	touch $@

# The two toolchains are installed, tested and run side by side (one CPU
# core each); each run traces a case once for all of its targets and
# compiles every distinct kernel once per target.
compile-check:
	$(MAKE) -j2 $(VENV_TPU)/.installed $(VENV_CUDA)/.installed
	mkdir -p $(COMPILE_OUT)
	status=0; \
	( $(VENV_TPU)/bin/python -m pytest -q -p no:cacheprovider tests/experiments/test_compile_check.py \
	  && $(VENV_TPU)/bin/python -m experiments.compile_kernels --toolchain=tpu --out=$(COMPILE_OUT)/tpu.json ) \
	  > $(COMPILE_OUT)/tpu.log 2>&1 & tpu=$$!; \
	( $(VENV_CUDA)/bin/python -m pytest -q -p no:cacheprovider tests/experiments/test_compile_check.py \
	  && $(VENV_CUDA)/bin/python -m experiments.compile_kernels --toolchain=cuda --out=$(COMPILE_OUT)/cuda.json ) \
	  > $(COMPILE_OUT)/cuda.log 2>&1 || status=1; \
	wait $$tpu || status=1; \
	tail -n 3 $(COMPILE_OUT)/tpu.log $(COMPILE_OUT)/cuda.log; \
	$(VENV_TPU)/bin/python -m experiments.compile_kernels --report=$(COMPILE_OUT)/tpu.json,$(COMPILE_OUT)/cuda.json --out=benchmarks/RESULTS_compile.md || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) $(VENV_TPU) $(VENV_CUDA) build *.egg-info
