# Two entry points; each sets up everything it needs first (scripts/bootstrap.sh).
VENV ?= .venv
export HF_HUB_OFFLINE ?= 1
export VLLM_HOST_IP ?= 127.0.0.1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup demo test test-fast bench bench-tokens router bench-router bench-tree

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

# target-only, specreason and lookahead side by side on the first 30 GSM8K test problems
# (about two hours on 2 CPU cores); resumable: `stepspec bench --resume runs/gsm8k30`.
bench: setup
	$(VENV)/bin/stepspec bench --dataset gsm8k --limit 30 --strategies target-only,specreason,lookahead --output-dir runs/gsm8k30

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
