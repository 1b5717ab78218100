# Two commands for a newcomer: `make run` (the pipeline on the embedded default) and `make test`;
# `make unlock` after a snakemake was killed hard, `make lint` before a commit.
# Each creates the virtual environment on first use (CPU build of torch, pinned in constraints-cpu.txt).
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
PYTEST_ARGS ?=

.PHONY: run unlock test lint venv clean

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints-cpu.txt -e '.[pipeline,dev,torchcodec]'
	touch $@

venv: $(VENV)/.installed

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

test: $(VENV)/.installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" OMP_NUM_THREADS=1 $(VENV)/bin/pytest $(PYTEST_ARGS)

# The linters CI runs before the tests: ruff (lint and format), snakefmt, snakemake --lint.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/snakefmt --check Snakefile workflow/
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/snakemake --lint

clean:
	rm -rf results .snakemake
