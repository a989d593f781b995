# Two entry points; each sets up everything it needs first (scripts/bootstrap.sh).
VENV ?= .venv
export HF_HUB_OFFLINE ?= 1
export VLLM_HOST_IP ?= 127.0.0.1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup demo test test-fast bench bench-steps

setup:
	bash scripts/bootstrap.sh
	$(VENV)/bin/stepspec models prepare

# The main job on the bundled pair: SpecReason on a GSM8K question. The 0.5B
# drafts each reasoning step, the 1.5B scores it and rewrites the rejected ones;
# inside the 1.5B, the 0.5B also drafts tokens. The trace streams as it grows.
demo: setup
	$(VENV)/bin/stepspec solve --dataset gsm8k --index 0 --strategy specreason --spec draft

# The whole test suite, real vLLM and the real pair included.
test: setup
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# Unit tests and tiny-model tests only (no bundled pair).
test-fast:
	bash scripts/bootstrap.sh
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not pair" $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/python benchmarks/token_speculation.py

# target-only, specreason and lookahead side by side on the first 20 GSM8K problems (about an hour on 2 CPU cores)
bench-steps: setup
	$(VENV)/bin/python benchmarks/step_strategies.py --limit 20
