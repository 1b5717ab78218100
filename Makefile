# A newcomer's commands (README "Getting started"): `make run` (the pipeline on the embedded default:
# dataset, training, conversion and evaluation of every checkpoint, the best one), `make report`
# (its HTML report, written to results/<run>/report.html), `make test-fast` (the
# quick tier) and `make test` (the whole suite); `make unlock` after a snakemake was killed hard,
# `make lint` before a commit, `make gpu-check` on a GPU machine. Each creates the virtual
# environment on first use (torch's version is pinned in constraints-cpu.txt, its build comes
# from TORCH_INDEX).
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
PYTEST_ARGS ?=
# The project's extras installed into $(VENV); add `diffusion` for Diffusion Policy's schedulers
# (README "Installing for real hardware"; `make slurm-plugin` adds the SLURM executor plugin).
EXTRAS ?= pipeline,dev,torchcodec
# PyTorch's wheel index for torch and torchcodec: the CPU build by default (a 190 MB download
# instead of the ~3 GB of CUDA libraries that PyPI's torch pulls); .../whl/cu128 and the like on
# a CUDA machine; empty: PyPI's. Where it cannot be reached, pip warns and takes them from the
# other indexes.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# The run that `make report` reports on: config/config.yaml's `run` (results/<run>/).
RUN ?= $(shell $(PY) -c "import yaml; print(yaml.safe_load(open('config/config.yaml'))['run'])")

# Released LeRobot for the interop suite (tests/interop), in its own venv: 0.6.1 needs Python 3.12
# and its own torch (the CUDA wheel, ~5 GB, runs on the CPU). LeRobot 0.4.4 runs on that same
# Python from an overlay folder of the packages whose 0.6.1 versions it cannot use. `make test`
# builds both when a Python 3.12 exists; without one the interop tests skip, saying what to install.
# LEROBOT_UPSTREAM_PYTHON=<python of an existing LeRobot 0.6.1 venv> skips the build.
LEROBOT_VENV ?= .venv-lerobot
PY312 ?= $(firstword $(wildcard $(shell pyenv prefix 3.12.1 2>/dev/null)/bin/python3.12) \
	$(shell command -v python3.12 2>/dev/null))
LEROBOT_061 := "lerobot[training,diffusion,peft,smolvla,pi,pusht]==0.6.1" torch==2.11.0 torchvision==0.26.0
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

# The torch range that pyproject.toml claims, tested on its ends: `make test-torch TORCH=2.11.0`
# builds .venv-torch-2.11.0 (Python 3.11; PyPI's torch==$(TORCH), the CUDA build, which runs on
# the CPU; no torchcodec, whose builds each pair with one torch: videos decode with PyAV) and runs
# the tests marked torch_range in it (what torch's own internals decide: FSDP2 sharding, DTensor,
# DCP save, resharding and conversion, async staging, mixed precision, the sharded EMA, the fused
# optimizer, activation checkpointing), torch's version printed first, less the cases marked
# one_torch (a variant whose torch internals a sibling case runs there too: DDP's mixed precision
# beside FSDP2's, a second source format of the same load path). .ci/run runs it for the oldest
# and the newest.
TORCH ?=
PY311 ?= python3.11
TORCH_RANGE_EXTRAS ?= pipeline,dev

# Our lerobot-train, lerobot-eval and lerobot-convert-dcp (the same as `lerobot-pipe train|eval|
# convert-dcp`), a distribution of their own that our venvs install and LeRobot's never gets: its
# venv keeps LeRobot's commands of those names (README "Beside LeRobot").
COMMANDS := ./lerobot_pipe_commands

# The venv's console scripts (snakemake, lerobot-train, lerobot-pipe) first on PATH, as after
# `source .venv/bin/activate`; one thread per training process.
VENV_ENV := PATH="$(abspath $(VENV))/bin:$$PATH" OMP_NUM_THREADS=1

.PHONY: run report unlock test test-fast test-beside test-torch lint gpu-check venv slurm-plugin \
	lerobot-venv bench-venv clean

# torch and torchcodec first, from TORCH_INDEX (only they: --no-deps, their dependencies come with
# the second install, from the usual indexes).
$(VENV)/.installed: pyproject.toml lerobot_pipe_commands/pyproject.toml constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --retries 1 --no-deps -c constraints-cpu.txt \
		$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch \
		$(if $(findstring torchcodec,$(EXTRAS)),torchcodec)
	$(PY) -m pip install --quiet -c constraints-cpu.txt -e '.[$(EXTRAS)]' $(COMMANDS)
	touch $@

venv: $(VENV)/.installed

# The SLURM executor plugin, for `snakemake --profile workflow/profiles/slurm`; not in the default
# venv: Snakemake imports every installed executor plugin at each start, and this one then runs
# `scontrol show config`, ~9 s wherever SLURM's tools are installed but no controller answers.
slurm-plugin: $(VENV)/.installed
	$(PY) -m pip install --quiet -c constraints-cpu.txt -e '.[slurm]'

# The venvs below install with --no-compile, then compile their modules once, on every core
# (pip compiles serially): where Python writes no .pyc files at import (PYTHONDONTWRITEBYTECODE=1,
# as on the CI machine), a venv without them compiles every module it imports at each process
# start: importing LeRobot's policy factory took ~24 s a process instead of ~9, and the interop
# suite starts a hundred of them. A file that does not compile (a package's test data) is left.
COMPILE_ALL = -m compileall -q -j 0

$(LEROBOT_VENV)/.installed:
	@test -n "$(PY312)" || { echo "lerobot-venv: no Python 3.12 (pyenv install 3.12.1)"; exit 1; }
	test -x $(LEROBOT_VENV)/bin/python || $(PY312) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LEROBOT_VENV)/bin/python -m pip install --quiet --no-compile $(LEROBOT_061)
	$(LEROBOT_VENV)/bin/python -m pip install --quiet --no-compile --no-deps --upgrade \
		--target $(LEROBOT_VENV)/overlay-0.4.4 $(LEROBOT_044_OVERLAY)
	$(LEROBOT_VENV)/bin/python $(COMPILE_ALL) $(LEROBOT_VENV)/lib $(LEROBOT_VENV)/overlay-0.4.4 \
		>/dev/null 2>&1 || true
	touch $@

lerobot-venv: $(LEROBOT_VENV)/.installed

$(BENCH_VENV)/.installed: pyproject.toml
	@test -n "$(PY312)" || { echo "bench-venv: no Python 3.12 (pyenv install 3.12.1)"; exit 1; }
	test -x $(BENCH_VENV)/bin/python || $(PY312) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet --no-compile $(BENCH_TORCH) -e '.[diffusion,smolvla]' \
		$(COMMANDS)
	$(BENCH_VENV)/bin/python $(COMPILE_ALL) $(BENCH_VENV)/lib >/dev/null 2>&1 || true
	touch $@

bench-venv: $(BENCH_VENV)/.installed

# torch first, alone, so that a version pip cannot install fails on its own line. The version
# named is the one installed: a machine-wide pip constraint file (PIP_CONSTRAINT or pip.conf's
# `constraint`; some machines cap torch's version there) does not apply to these venvs.
.venv-torch-%/.installed: pyproject.toml
	test -x .venv-torch-$*/bin/python || $(PY311) -m venv .venv-torch-$*
	.venv-torch-$*/bin/python -m pip install --quiet --upgrade pip
	PIP_CONSTRAINT=/dev/null .venv-torch-$*/bin/python -m pip install --quiet --no-compile \
		torch==$*
	PIP_CONSTRAINT=/dev/null .venv-torch-$*/bin/python -m pip install --quiet --no-compile \
		torch==$* -e '.[$(TORCH_RANGE_EXTRAS)]' $(COMMANDS)
	.venv-torch-$*/bin/python $(COMPILE_ALL) .venv-torch-$*/lib >/dev/null 2>&1 || true
	touch $@

ifneq ($(TORCH),)
test-torch: .venv-torch-$(TORCH)/.installed
	@start=$$(date +%s); .venv-torch-$(TORCH)/bin/python -c \
	"import torch; print(f'make test-torch: torch {torch.__version__} ({torch.__file__})')"; \
	PATH="$(abspath .venv-torch-$(TORCH))/bin:$$PATH" OMP_NUM_THREADS=1 \
	.venv-torch-$(TORCH)/bin/pytest -m "torch_range and not one_torch" $(PYTEST_ARGS); status=$$?; \
	echo "make test-torch: torch $(TORCH), $$(( $$(date +%s) - start )) s, exit status $$status"; \
	exit $$status
else
test-torch:
	@echo "make test-torch: name the version, e.g. make test-torch TORCH=2.11.0" >&2; exit 2
endif

# A lock Snakemake left in .snakemake/locks after it was killed hard stops the next run: say what
# to do (a failed run removes its own lock, so one still there belongs to another snakemake).
run: $(VENV)/.installed
	@$(VENV_ENV) $(VENV)/bin/snakemake --cores $(CORES) \
	|| { status=$$?; if [ -n "$$(ls -A .snakemake/locks 2>/dev/null)" ]; then \
	echo "make run: Snakemake's lock is in .snakemake/locks. If no other snakemake runs in this" \
	"folder (one was killed hard), run: make unlock && make run" >&2; fi; exit $$status; }

# Snakemake's HTML report of the run, beside its results; it opens on the loss, evaluation
# (success and rewards per checkpoint, the best one starred) and throughput figures and the
# checkpoint table (workflow/report/workflow.rst, shown as the landing page because
# workflow/report/metadata.yaml is given). During a run (or after a failed one) the report of what
# exists then: lerobot_pipe/pipeline/report_job.py.
report: $(VENV)/.installed
	$(VENV_ENV) $(VENV)/bin/lerobot-pipe report --output=results/$(RUN)/report.html

# snakemake --unlock, refused while a trainer still holds a run folder of results/ (its run lock).
unlock: $(VENV)/.installed
	@for dir in results/*/train; do [ ! -d "$$dir" ] \
	|| $(VENV)/bin/lerobot-pipe check-run-lock --output_dir="$$dir" || exit 1; done
	$(VENV)/bin/snakemake --unlock

test: $(VENV)/.installed $(UPSTREAM)
	$(VENV_ENV) $(VENV)/bin/pytest $(PYTEST_ARGS)

# The quick tier (pytest --tier=fast, tests/conftest.py: no test marked slow, interop or slurm;
# tests/test_fast_tier.py checks that it still imports every module of lerobot_pipe). Never
# builds LeRobot's venv; prints its own wall time (CI's log shows it).
test-fast: $(VENV)/.installed
	@start=$$(date +%s); $(VENV_ENV) $(VENV)/bin/pytest --tier=fast $(PYTEST_ARGS); \
	status=$$?; echo "make test-fast: $$(( $$(date +%s) - start )) s, exit status $$status"; \
	exit $$status

# Living beside LeRobot (tests/beside, marker beside): this checkout installed as a user would
# (not editable, extras pipeline,smolvla,pi) into a hard-linked copy of LeRobot's venv: no version
# and no file of LeRobot's changes, on install and uninstall; `pip check` clean; tests/hub on its
# huggingface_hub 1.x. Prints its wall time (CI's log shows it).
test-beside: $(VENV)/.installed $(UPSTREAM)
	@start=$$(date +%s); $(VENV_ENV) $(VENV)/bin/pytest -m beside tests/beside $(PYTEST_ARGS); \
	status=$$?; echo "make test-beside: $$(( $$(date +%s) - start )) s, exit status $$status"; \
	exit $$status

# bench/gpu_smoke.py on this machine's GPU: nccl, bf16 training, a resume; prints what it verified;
# bench/gpu_memory_check.py: the memory plan against max_memory_allocated (band 0.85-1.15).
gpu-check: $(VENV)/.installed
	$(VENV_ENV) $(PY) bench/gpu_smoke.py
	$(VENV_ENV) $(PY) bench/gpu_memory_check.py

# The linters CI runs before the tests: ruff (lint and format), snakefmt, snakemake --lint.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV_ENV) $(VENV)/bin/snakefmt --check Snakefile workflow/
	$(VENV_ENV) $(VENV)/bin/snakemake --lint

clean:
	rm -rf results .snakemake
