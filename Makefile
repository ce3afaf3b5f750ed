# The two commands a newcomer needs:  `make serve`  and  `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv serve test check lint typecheck system-packages torchserve-venv demo-model bench compat image gpu-kit gpu-kit-dry-run clean

$(STAMP): pyproject.toml bench/pyproject.toml requirements-dev.txt scripts/install.sh
	PYTHON=$(PYTHON) scripts/install.sh $(VENV) dev
	touch $(STAMP)

venv: $(STAMP)

## Start Ferry on the bundled demo model (inference API on http://127.0.0.1:8080).
serve: $(STAMP)
	$(BIN)/ferry serve --model-store examples/demo/model-store --models shapes=shapes.mar

## Lint, type-check and run the whole test suite (what CI runs).
test: check

check: $(STAMP) lint typecheck system-packages torchserve-venv
	$(BIN)/pytest -q

## HAProxy for the load-balancer tests (installed when root with apt-get, else they skip).
system-packages:
	bash scripts/system-packages.sh

lint: $(STAMP)
	$(BIN)/ruff check ferry bench tests benchmarks examples
	$(BIN)/ruff format --check ferry bench tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy

## TorchServe 0.12 in .venv-torchserve for tests/compat; never fails the build (they skip).
torchserve-venv: $(STAMP)
	@if ! command -v java >/dev/null && [ -z "$$JAVA_HOME" ]; then \
	    echo "note: no Java (java on PATH or JAVA_HOME) to run TorchServe: tests/compat will skip" >&2; \
	elif ! bash scripts/torchserve-venv.sh; then \
	    echo "note: TorchServe 0.12 could not be installed (above): tests/compat will skip" >&2; \
	fi

## Same archives, same requests to TorchServe 0.12 (in .venv-torchserve) and to Ferry.
compat: $(STAMP)
	bash scripts/torchserve-venv.sh
	$(BIN)/pytest -q tests/compat

## Retrain the demo model and rebuild its archive (a few minutes on 2 cores).
demo-model: $(STAMP)
	$(BIN)/python -m examples.demo.train --out examples/demo/model-store

## Ferry's container image with podman, as root (scripts/image.sh; docs/kserve.md).
image:
	bash scripts/image.sh

## Core benchmark: ResNet-18 through the server against the same pipeline offline.
bench: $(STAMP)
	$(BIN)/python benchmarks/core_benchmark.py --out benchmarks/results/core.md

## The GPU kit (docs/testing.md): .gpu-kit/ holds the wheels a GPU machine lacks and run.sh.
gpu-kit: $(STAMP)
	$(BIN)/python -m benchmarks.gpu_kit build --kit .gpu-kit

## The kit's dry run here: every part SKIPs for want of a GPU (results in /tmp/gpu-kit-dry-run).
gpu-kit-dry-run: gpu-kit
	rm -rf /tmp/gpu-kit-dry-run
	OUT=/tmp/gpu-kit-dry-run PYTHON=$(BIN)/python bash .gpu-kit/run.sh --dry-run

clean:
	rm -rf $(VENV) .venv-torchserve .mypy_cache .pytest_cache .ruff_cache
