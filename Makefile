# Two entry points; each sets up everything it needs first (scripts/bootstrap.sh).
VENV ?= .venv
export HF_HUB_OFFLINE ?= 1
export VLLM_HOST_IP ?= 127.0.0.1
export TOKENIZERS_PARALLELISM ?= false

# vLLM's CPU build wants Intel OpenMP preloaded for speculation: measured here, the
# 1.5B decoded 1.1-1.3x faster with it (with and without draft-model speculation).
IOMP = $(abspath $(wildcard $(VENV)/lib/libiomp5.so))
RUN_FAST = $(if $(IOMP),LD_PRELOAD=$(IOMP))

.PHONY: setup demo test test-fast bench bench-tokens router bench-router bench-tree

setup:
	bash scripts/bootstrap.sh
	$(VENV)/bin/stepspec models prepare

# The main job on the bundled pair: SpecReason on a GSM8K question. The 0.5B
# drafts each reasoning step, the 1.5B scores it and rewrites the rejected ones;
# inside the 1.5B, the 0.5B also drafts tokens. The trace streams as it grows.
demo: setup
	$(RUN_FAST) $(VENV)/bin/stepspec solve --dataset gsm8k --index 0 --strategy specreason --spec draft

# The whole test suite, real vLLM and the real pair included.
test: setup
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# Unit tests and tiny-model tests only (no bundled pair).
test-fast:
	bash scripts/bootstrap.sh
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not pair" $(PYTEST_ARGS)

# The verifier comparison on the first 100 GSM8K test problems, in one resumable run:
# target-only; specreason with the 0-9 score judge; specreason with the likelihood judge
# from lossless to loose (exact: only the target's greedy token passes; typed: the
# judge's defaults, floor -5 and digits/operators must be the target's top token;
# loose: floor -8, any digit the floor lets through); lookahead with the likelihood judge.
# Suffix decoding runs inside the 1.5B in every arm (the fastest token-level method for
# it here: 1.72x alone, `make bench-tokens`; and no third model in memory). Throughput mode first (per arm,
# all 100 problems at once, wall time measured), then latency mode on the first 30 for
# target-only, sr-score and sr-lik-typed. `make bench` resumes the run when its
# directory holds one (`stepspec bench --resume BENCH_DIR`; an arm cut short runs again).
BENCH_DIR ?= benchmarks/measured/gsm8k100_verify_cpu
BENCH_ARMS = --strategies target-only,sr-score,sr-lik-exact,sr-lik-typed,sr-lik-loose,la-lik \
	--opt sr-score.strategy=specreason --opt sr-score.judge=score \
	--opt sr-lik-exact.strategy=specreason --opt sr-lik-exact.judge=likelihood --opt sr-lik-exact.judge.max_rank=1 \
	--opt sr-lik-exact.judge.floor=none --opt sr-lik-exact.judge.math_max_rank=none \
	--opt sr-lik-typed.strategy=specreason --opt sr-lik-typed.judge=likelihood \
	--opt sr-lik-loose.strategy=specreason --opt sr-lik-loose.judge=likelihood --opt sr-lik-loose.judge.floor=-8 \
	--opt sr-lik-loose.judge.math_max_rank=none \
	--opt la-lik.strategy=lookahead --opt la-lik.judge=likelihood
bench: setup
	@if ls $(BENCH_DIR)/results_*.json >/dev/null 2>&1; then \
		echo "resuming the run in $(BENCH_DIR)"; \
		$(RUN_FAST) $(VENV)/bin/stepspec bench --resume $(BENCH_DIR); \
	else \
		$(RUN_FAST) $(VENV)/bin/stepspec bench --dataset gsm8k --limit 100 --mode both --latency-limit 30 \
			--latency-strategies target-only,sr-score,sr-lik-typed $(BENCH_ARMS) \
			--spec suffix --max-tokens 640 --kv-cache-gib 1.5 --max-num-seqs 100 --output-dir $(BENCH_DIR); \
	fi

# token-level methods (none, ngram, suffix, draft) inside the target, side by side
bench-tokens: setup
	$(VENV)/bin/python benchmarks/token_speculation.py

# The learned router end to end: collect both models' steps on 200 generated
# grade-school problems (resumable: run it again), train, then bench it beside
# target-only, specreason and the oracle on the first 30 GSM8K test problems.
router: setup
	$(VENV)/bin/stepspec router collect --num-problems 200 --spec none --output-dir runs/router-data
	$(VENV)/bin/stepspec router train runs/router-data --out runs/router.pt

bench-router: router
	$(VENV)/bin/stepspec bench --dataset gsm8k --limit 30 --strategies target-only,specreason,arbitrage,arbitrage-oracle --router runs/router.pt --output-dir runs/gsm8k30-router

# Speculative tree search and best-of-n against their target-only twins (same k, beam,
# depth; same n) on the first 20 GSM8K test problems; suffix decoding inside the target
# reuses the text of sibling branches.
bench-tree: setup
	$(VENV)/bin/stepspec bench --dataset gsm8k --limit 20 --spec suffix --max-tokens 512 \
		--strategies tree,tree-target,best-of-n,best-of-n-target \
		--opt tree.k=3 --opt tree.beam=2 --opt tree-target.k=3 --opt tree-target.beam=2 \
		--opt best-of-n.n=5 --opt best-of-n-target.n=5 --output-dir benchmarks/measured/gsm8k20_tree_cpu
