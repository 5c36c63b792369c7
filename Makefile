# Graylane: `make run` (set-up + local stack + demo) and `make test` (set-up + tests).
# Both build the llama.cpp engine server once per machine (`make engines`; cached after).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup engines smollm2-onnx run test deploy-test images lint typecheck protos protos-check kafka-start kafka-stop registry-start registry-stop bench clean

$(STAMP): pyproject.toml
	@echo "==> setting up $(VENV) (python >= 3.11)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@# setuptools warns that the repo's own graylane/ folder shadows the package: it is the package
	@PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet --progress-bar off -e ".[dev]"
	@touch $(STAMP)

setup: $(STAMP)

# llama-server + llama-quantize built from the pinned llama.cpp sources, SmolLM2-135M and its
# lower rungs, in ${GRAYLANE_CACHE_DIR:-~/.cache/graylane}: minutes the first time, then cached.
engines: setup
	@$(BIN)/python deploy/engines/llamacpp.py setup

# SmolLM2 imported from its GGUF into ONNX (no torch) with its weight-only rungs, validated
# on English prompts and registered with its servable rungs (builder/examples/smollm2-gguf.yaml;
# exit 2, a rung outside its tolerance, does not fail the target). The import is cached in
# the artifact store: a rebuild (--force, or a new version) does not convert again.
smollm2-onnx: setup
	@$(BIN)/python deploy/engines/llamacpp.py model >/dev/null
	@$(BIN)/graylane build builder/examples/smollm2-gguf.yaml; rc=$$?; test $$rc -eq 0 -o $$rc -eq 2

run: setup engines
	@echo "==> metrics: every service serves /metrics /healthz /readyz (ports printed below);"
	@echo "    '$(BIN)/graylane up --with-prometheus' adds Prometheus on http://127.0.0.1:9090"
	@echo "    (rules from deploy/prometheus, dashboard in deploy/grafana)"
	@$(BIN)/graylane demo

test: setup
	@bash scripts/test.sh

# The images built and run, the pod specs started with podman kube play (also in `make test`).
deploy-test: setup
	@bash scripts/test.sh -m containers

# The CPU image built, signed (sigstore, a key pair made here once) into the local registry
# and pulled back under the policy that requires the signature (the registry keeps running).
images: setup
	$(BIN)/python deploy/containers/containers.py build

lint: setup
	$(BIN)/ruff check .
	$(BIN)/python scripts/typecheck.py

protos: setup
	$(BIN)/python protos/generate.py

protos-check: setup
	$(BIN)/python protos/generate.py --check

kafka-start: setup
	$(BIN)/python deploy/kafka/kafka.py start

kafka-stop:
	$(BIN)/python deploy/kafka/kafka.py stop

# The local OCI registry (distribution, built from its Go module once) on 127.0.0.1.
registry-start: setup
	$(BIN)/python deploy/registry/registry.py start

registry-stop:
	@test ! -x $(BIN)/python || $(BIN)/python deploy/registry/registry.py stop

clean: kafka-stop registry-stop
	rm -rf .local
