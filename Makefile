# The two set-up commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

CORE   := $(VENV)/.installed-core

.PHONY: demo test bench deps demo-deps clean

# What the demo needs (the package and its own dependencies; debootstrap, a compiler, criu) ...
demo-deps:
	@scripts/install-deps demo

$(CORE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null
	$(BIN)/pip install -q -e .
	@touch $(CORE)

# ... and what the tests add: every integration's framework, the test servers, a browser; and Harbor,
# which needs Python >= 3.12: its own venv on Debian trixie's python3.13 (cached under /opt/sandtree; its
# tests skip, saying why, if it could not be made).
deps:
	@scripts/install-deps test
	@scripts/install-harbor || echo "note: Harbor's Python could not be installed; its tests will skip" >&2

$(STAMP): pyproject.toml $(CORE)
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

demo: demo-deps $(CORE)
	$(BIN)/python examples/demo.py

test: deps $(STAMP)
	SANDTREE_TEST_BOOKWORM_AHEAD=1 $(BIN)/python -m pytest -q -ra --durations=25 -n 2 --dist loadfile tests

bench: deps $(STAMP)
	$(BIN)/python bench/bench.py
	PYTHONPATH=src $(BIN)/python bench/storeback.py
	PYTHONPATH=src $(BIN)/python bench/durability.py
	PYTHONPATH=src $(BIN)/python bench/terminal.py
	PYTHONPATH=src $(BIN)/python bench/watch.py
	PYTHONPATH=src $(BIN)/python bench/cluster.py
	PYTHONPATH=src $(BIN)/python bench/rayclient.py
	PYTHONPATH=src $(BIN)/python bench/probes.py
	PYTHONPATH=src $(BIN)/python bench/startup.py
	PYTHONPATH=src $(BIN)/python bench/harborbench.py

clean:
	rm -rf $(VENV) build src/*.egg-info
