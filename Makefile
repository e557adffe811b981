# Fresh-machine entry points (README.md). Everything installs from this repo's files.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# torch is pinned to the local CPU wheel: a bare requirement would pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: install lint test test-unit test-fast demo sglang-env sglang-overlays fetch-sglang-sources interop-env bench charts

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q "$(TORCH_PIN)"
	$(VPY) -m pip install -q -c constraints.txt -e ".[test,plots,kimi,remote]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/hs-dataset build --config tiny-deepseek-hf --out out/tiny-deepseek-hf
	$(VENV)/bin/hs-dataset verify out/tiny-deepseek-hf

# Lint (ruff), format check (ruff format), types (mypy) and import layers (lint-imports): configured in
# pyproject.toml; docs/ARCHITECTURE.md ("Code quality") says what each checks and what is still excused.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	PYTHONPATH=$(CURDIR) $(VENV)/bin/lint-imports

test: install lint sglang-env sglang-overlays fetch-sglang-sources interop-env
	$(VPY) -m pytest -q --durations=30 tests

test-unit: install
	$(VPY) -m pytest -q tests -m unit

test-fast: install
	$(VPY) -m pytest -q tests -m "not sglang and not slow"

# speculators and SpecForge readers, to prove exports load with the trainers' own code
interop-env: install
	bash scripts/make_interop_env.sh $(VENV)

fetch-sglang-sources:
	bash scripts/fetch_sglang_sources.sh

bench: install
	$(VPY) benchmarks/bench_shards.py

# docs/BENCHMARKS.md's charts (docs/img/*.png), redrawn from the recorded runs in benchmarks/results/
charts: install
	$(VPY) benchmarks/charts.py

sglang-env:
	bash scripts/make_sglang_env.sh

# older SGLang releases on the CPU server env, for the version matrix (tests/capture/sglang/test_versions.py;
# 0.5.5, patched in a private copy: tests/server_patch/legacy/test_patched_server.py)
sglang-overlays: sglang-env
	bash scripts/make_sglang_overlays.sh

