# The entry points; each sets up everything it needs first (scripts/bootstrap.sh). Past
# experiments are bench config files in benchmarks/runs/, run by `make bench-config CONFIG=FILE`;
# the measuring scripts are listed in benchmarks/README.md.
VENV ?= .venv
export HF_HUB_OFFLINE ?= 1
export VLLM_HOST_IP ?= 127.0.0.1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup demo demo-speed test test-fast bench bench-config

setup:
	bash scripts/bootstrap.sh
	$(VENV)/bin/stepspec models prepare

# The main job on the bundled pair: SpecReason on a GSM8K question. The 0.5B
# drafts each reasoning step, the 1.5B verifies it token by token and writes where
# it cuts; under both, suffix decoding drafts tokens. The trace streams as it grows.
demo: setup
	$(VENV)/bin/stepspec solve --dataset gsm8k --index 0 --strategy specreason

# The demo's reasoning time against the same command with --strategy target-only, 3 runs each.
demo-speed: setup
	$(VENV)/bin/python benchmarks/demo_speed.py --json benchmarks/measured/demo_cpu/demo.json

# The whole test suite, real vLLM and the real pair included; the 25 slowest tests listed at the end
# (CI's budget is an hour on two cores).
# Two workers (tests/conftest.py: cores of their own; the bundled pair's tests all on one),
# then the tests that need the machine to themselves, alone. Both parts run; either failing fails.
TEST_WORKERS ?= 2
PYTEST = $(VENV)/bin/python -m pytest -q -p no:cacheprovider
test: setup
	status=0; \
	$(PYTEST) -n $(TEST_WORKERS) -m "not whole_machine" --durations=25 $(PYTEST_ARGS) || status=$$?; \
	$(PYTEST) -m whole_machine --durations=5 $(PYTEST_ARGS) || { s=$$?; [ $$s = 5 ] || status=$$s; }; \
	exit $$status

# Unit tests and tiny-model tests only (no bundled pair).
test-fast:
	bash scripts/bootstrap.sh
	$(PYTEST) -n $(TEST_WORKERS) -m "not pair and not whole_machine" $(PYTEST_ARGS)

# The speed run: the default specreason against target-only and draft-only (the pair's ceiling)
# on the first 100 GSM8K test problems (benchmarks/runs/speed.yaml). Resumable: run it again.
bench: setup
	$(VENV)/bin/stepspec bench --config benchmarks/runs/speed.yaml$(if $(MODE), --mode $(MODE))

# Any bench config file (benchmarks/runs/*.yaml): starts its run in the file's output_dir, or
# resumes the run there; MODE=latency (or throughput) runs only that mode of a started run.
bench-config: setup
	$(VENV)/bin/stepspec bench --config $(CONFIG)$(if $(MODE), --mode $(MODE))
