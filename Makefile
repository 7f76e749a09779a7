PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make run` trains in a new directory under runs/ every time;
# `make run WORKDIR=runs/<name>` resumes (or re-evaluates) that run.
WORKDIR ?= runs/$(shell date +%Y%m%d-%H%M%S)

.PHONY: run verify test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) setup.cfg pyproject.toml constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,analysis,tensorboard]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) experiments/train.py --workdir=$(WORKDIR) --compilation_cache=runs/.xla_cache

verify: $(STAMP)
	$(PY) experiments/verify_forms.py

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

bench: $(STAMP)
	$(PY) experiments/bench_forms.py

clean:
	rm -rf $(VENV) build *.egg-info
