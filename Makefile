# openmrc — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The optional extras installed with openmrc: `make test EXTRAS=dev,mpi,ray,torch` (as CI runs it) also runs the Ray
# and torch-backend tests, which skip without them. Changing EXTRAS on an existing .venv needs `make clean` first.
EXTRAS ?= dev,mpi
# The hot modules compiled with mypyc (scripts/build_native.py); rebuilt when any of them changes.
NATIVE := src/openmrc/_native.json
NATIVE_SRC := $(shell $(PYTHON) scripts/build_native.py --list)

.PHONY: demo test lint typecheck pytest pytest-pure native bench fuzz clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

# The header classes, generated from their layout descriptions (rewritten only when the text changes).
src/openmrc/wire/_headers_gen.py: src/openmrc/wire/_layouts.py | $(STAMP)
	OPENMRC_PURE=1 $(BIN)/python -m openmrc.wire._layouts
	touch $@

$(NATIVE): $(STAMP) $(NATIVE_SRC) scripts/build_native.py scripts/native_api.py
	$(BIN)/python scripts/build_native.py

native: $(NATIVE)

demo: $(NATIVE)
	$(BIN)/openmrc demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(NATIVE)
	$(BIN)/python -m pytest -W error::RuntimeWarning

# The same suite on the interpreted sources: both must behave identically.
pytest-pure: $(STAMP)
	OPENMRC_PURE=1 $(BIN)/python -m pytest

test: lint typecheck pytest pytest-pure

bench: $(STAMP)
	$(BIN)/python benchmarks/wire_bench.py

# Coverage-guided fuzzing (atheris) of the packet parser, the frame parser and a NIC's receive path, each
# for FUZZ_SECONDS; new inputs and crash files go to build/fuzz/. `make test` runs a short bounded round.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz.run --seconds $(FUZZ_SECONDS)

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache .hypothesis $(NATIVE)
	find src -name '*.so' -delete
