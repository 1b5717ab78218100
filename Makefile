# Two commands for a newcomer: `make run` (the pipeline on the embedded default) and `make test`;
# `make unlock` after a snakemake was killed hard, `make lint` before a commit.
# Each creates the virtual environment on first use (CPU build of torch, pinned in constraints-cpu.txt).
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
PYTEST_ARGS ?=

# Released LeRobot for the interop suite (tests/interop), in its own venv: 0.6.1 needs Python 3.12
# and its own torch (the CUDA wheel, ~5 GB, runs on the CPU). LeRobot 0.4.4 runs on that same
# Python from an overlay folder of the packages whose 0.6.1 versions it cannot use. `make test`
# builds both when a Python 3.12 exists; without one the interop tests skip, saying what to install.
# LEROBOT_UPSTREAM_PYTHON=<python of an existing LeRobot 0.6.1 venv> skips the build.
LEROBOT_VENV ?= .venv-lerobot
PY312 ?= $(firstword $(wildcard $(shell pyenv prefix 3.12.1 2>/dev/null)/bin/python3.12) \
	$(shell command -v python3.12 2>/dev/null))
LEROBOT_061 := "lerobot[training,diffusion,peft]==0.6.1" torch==2.11.0 torchvision==0.26.0
LEROBOT_044_OVERLAY := lerobot==0.4.4 draccus==0.10.0 pyyaml-include==1.4.1 pyserial==3.5 \
	deepdiff==8.6.1 orderly-set==5.5.0 imageio==2.37.0 transformers==4.57.1 huggingface_hub==0.35.3
ifneq ($(LEROBOT_UPSTREAM_PYTHON),)
UPSTREAM := 
else ifneq ($(PY312),)
UPSTREAM := $(LEROBOT_VENV)/.installed
export LEROBOT_UPSTREAM_PYTHON := $(CURDIR)/$(LEROBOT_VENV)/bin/python
export LEROBOT_UPSTREAM_044_OVERLAY := $(CURDIR)/$(LEROBOT_VENV)/overlay-0.4.4
endif

# lerobot_pipe on LeRobot 0.6.1's torch build (2.11.0, the CUDA wheel, which runs on the CPU too) and
# the torchcodec that pairs with it, for bench/bench_vs_lerobot.py: the same torch on both sides.
BENCH_VENV ?= .venv-bench
BENCH_TORCH := torch==2.11.0 torchcodec==0.11.1

.PHONY: run unlock test lint venv lerobot-venv bench-venv clean

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints-cpu.txt -e '.[pipeline,dev,torchcodec]'
	touch $@

venv: $(VENV)/.installed

$(LEROBOT_VENV)/.installed:
	@test -n "$(PY312)" || { echo "lerobot-venv: no Python 3.12 (pyenv install 3.12.1)"; exit 1; }
	test -x $(LEROBOT_VENV)/bin/python || $(PY312) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LEROBOT_VENV)/bin/python -m pip install --quiet --no-compile $(LEROBOT_061)
	$(LEROBOT_VENV)/bin/python -m pip install --quiet --no-compile --no-deps --upgrade \
		--target $(LEROBOT_VENV)/overlay-0.4.4 $(LEROBOT_044_OVERLAY)
	touch $@

lerobot-venv: $(LEROBOT_VENV)/.installed

$(BENCH_VENV)/.installed: pyproject.toml
	@test -n "$(PY312)" || { echo "bench-venv: no Python 3.12 (pyenv install 3.12.1)"; exit 1; }
	test -x $(BENCH_VENV)/bin/python || $(PY312) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet --no-compile $(BENCH_TORCH) -e '.[diffusion]'
	touch $@

bench-venv: $(BENCH_VENV)/.installed

# A lock Snakemake left in .snakemake/locks after it was killed hard stops the next run: say what
# to do (a failed run removes its own lock, so one still there belongs to another snakemake).
run: $(VENV)/.installed
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" OMP_NUM_THREADS=1 $(VENV)/bin/snakemake --cores $(CORES) \
	|| { status=$$?; if [ -n "$$(ls -A .snakemake/locks 2>/dev/null)" ]; then \
	echo "make run: Snakemake's lock is in .snakemake/locks. If no other snakemake runs in this" \
	"folder (one was killed hard), run: make unlock && make run" >&2; fi; exit $$status; }

# snakemake --unlock, refused while a trainer still holds a run folder of results/ (its run lock).
unlock: $(VENV)/.installed
	@for dir in results/*/train; do [ ! -d "$$dir" ] \
	|| $(VENV)/bin/lerobot-pipe check-run-lock --output_dir="$$dir" || exit 1; done
	$(VENV)/bin/snakemake --unlock

test: $(VENV)/.installed $(UPSTREAM)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" OMP_NUM_THREADS=1 $(VENV)/bin/pytest $(PYTEST_ARGS)

# The linters CI runs before the tests: ruff (lint and format), snakefmt, snakemake --lint.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/snakefmt --check Snakefile workflow/
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/snakemake --lint

clean:
	rm -rf results .snakemake
