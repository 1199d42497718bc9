# The two set-up commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench deps clean

deps:
	@scripts/install-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

demo: deps $(STAMP)
	$(BIN)/python examples/demo.py

test: deps $(STAMP)
	SANDTREE_TEST_BOOKWORM_AHEAD=1 $(BIN)/python -m pytest -q -ra --durations=25 -n 2 --dist loadfile tests

bench: deps $(STAMP)
	$(BIN)/python bench/bench.py
	PYTHONPATH=src $(BIN)/python bench/storeback.py
	PYTHONPATH=src $(BIN)/python bench/durability.py
	PYTHONPATH=src $(BIN)/python bench/terminal.py
	PYTHONPATH=src $(BIN)/python bench/cluster.py
	PYTHONPATH=src $(BIN)/python bench/rayclient.py
	PYTHONPATH=src $(BIN)/python bench/probes.py

clean:
	rm -rf $(VENV) build src/*.egg-info
