# Two commands a new user needs: `make quickstart` and `make test`.
VENV ?= .venv
EXTRAS ?= runtime,k8s,dev
BIN := $(VENV)/bin

.PHONY: setup quickstart test test-fast test-slow bench clean

$(BIN)/.installed: pyproject.toml installer/install.sh installer/constraints.txt
	bash installer/install.sh --venv $(VENV) --extras $(EXTRAS) --no-doctor
	touch $@

setup: $(BIN)/.installed

quickstart: setup
	-$(BIN)/verl-deploy doctor
	$(BIN)/python -m verl_runtime train examples/quickstart.yaml

test: setup
	$(BIN)/pytest

test-fast: setup
	$(BIN)/pytest -m "not slow and not docker"

test-slow: setup
	$(BIN)/pytest -m slow

# GRPO steps/s against TRL on the CPU preset (see bench/README.md; the GPU preset: --preset gpu).
bench: setup
	bash installer/install.sh --venv $(VENV) --extras $(EXTRAS),bench --no-doctor
	$(BIN)/python bench/grpo_vs_trl.py --preset cpu

clean:
	rm -rf $(VENV) runs .pytest_cache
