# Two entry points; each sets up everything it needs first (scripts/bootstrap.sh).
VENV ?= .venv
export HF_HUB_OFFLINE ?= 1
export VLLM_HOST_IP ?= 127.0.0.1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup demo test test-fast bench

setup:
	bash scripts/bootstrap.sh
	$(VENV)/bin/stepspec models prepare

# The main job on the bundled pair: one GSM8K question answered by the 1.5B
# target, the 0.5B draft speculating tokens under it.
demo: setup
	$(VENV)/bin/stepspec solve --dataset gsm8k --index 0 --spec draft

# The whole test suite, real vLLM and the real pair included.
test: setup
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# Unit tests and tiny-model tests only (no bundled pair).
test-fast:
	bash scripts/bootstrap.sh
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not pair" $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/python benchmarks/token_speculation.py
