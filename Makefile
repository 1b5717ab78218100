# Two commands for a newcomer: `make run` (the pipeline on the embedded default) and `make test`.
# Each creates the virtual environment on first use (CPU build of torch, pinned in constraints-cpu.txt).
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
PYTEST_ARGS ?=

.PHONY: run test lint venv clean

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints-cpu.txt -e '.[pipeline,dev,torchcodec]'
	touch $@

venv: $(VENV)/.installed

run: $(VENV)/.installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" OMP_NUM_THREADS=1 $(VENV)/bin/snakemake --cores $(CORES)

test: $(VENV)/.installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" OMP_NUM_THREADS=1 $(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean:
	rm -rf results .snakemake
