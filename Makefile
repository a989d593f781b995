# Two entry points; each sets up everything it needs first (scripts/bootstrap.sh).
VENV ?= .venv
export HF_HUB_OFFLINE ?= 1
export VLLM_HOST_IP ?= 127.0.0.1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup demo demo-speed test test-fast bench bench-verify bench-engines bench-contention bench-serve bench-tokens align bench-aligned bench-frontier bench-frontier-report router bench-router bench-router-generated bench-tree bench-siblings

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

# The speed run (issue 52): the default `specreason` against target-only and draft-only (the
# pair's ceiling) on the first 100 GSM8K test problems, each engine at its defaults (dtype
# auto: measured per machine; the token-level methods `make bench-engines` chose, the target's
# each strategy's own), every arm and solve starting with cold caches. Throughput: waves of 25
# at once (resumable wave by wave), with target-only also on suffix decoding (specreason's
# target, faster in a batch than the draft model inside it); latency: the first 30, one at a
# time, interleaved. Resumable: run it again. (Earlier runs: benchmarks/measured/gsm8k100_speed_cpu,
# 2026-12-02, before the target's method was each strategy's own; gsm8k100_speed_2026-12-03_cpu,
# before the drafted opening and the governor's bounded exploration.)
BENCH_DIR ?= benchmarks/measured/gsm8k100_speed_2026-12-03b_cpu
BENCH_ARMS = --dataset gsm8k --limit 100 --mode both --latency-limit 30 --throughput-wave 25 \
	--max-tokens 640 --kv-cache-gib 1.0 --strategies target-only,specreason,draft-only,to-suffix \
	--latency-strategies target-only,specreason,draft-only \
	--opt to-suffix.strategy=target-only --opt to-suffix.target_spec=suffix
bench: setup
	$(call bench_run,$(BENCH_DIR),$(BENCH_ARMS))

# The verifier comparison (both engines in float32, as before dtypes were measured) on the
# first 100 GSM8K test problems, in two resumable runs (each resumes where it stopped: `stepspec bench --resume DIR`; an arm cut short runs again).
# Suffix decoding runs inside the 1.5B in every arm (the fastest token-level method for it
# here: 1.72x alone, `make bench-tokens`; and no third model in memory); 640 tokens.
# 1. VERIFY_DIR: target-only; specreason with the 0-9 score judge; specreason with the
#    likelihood judge from lossless to loose (exact: only the target's greedy token passes;
#    typed: floor -5 and digits/operators must be the target's top token; loose: floor -8),
#    all with the draft writing from the first step (first_target_steps=0). Throughput
#    (per arm, all 100 at once, wall time) and latency (first 30, one at a time, interleaved)
#    for target-only, sr-score and sr-lik-typed.
# 2. BENCH_PLAN_DIR, all timed in one session: target-only; specreason's default (typed
#    likelihood, the target writes the first two steps, the opening and the plan); lookahead
#    with the likelihood judge. Throughput for all three, latency for the first two.
VERIFY_DIR ?= benchmarks/measured/gsm8k100_verify_cpu
BENCH_PLAN_DIR ?= benchmarks/measured/gsm8k100_verify_plan_cpu
# BENCH_COMMON: what the verifier, router and tree runs share (float32, as they were committed).
BENCH_COMMON = --dataset gsm8k --target-dtype float32 --draft-dtype float32 --limit 100 --mode both --latency-limit 30 \
	--spec suffix --max-tokens 640 --kv-cache-gib 1.5 --max-num-seqs 100
BENCH_VERIFY_ARMS = --strategies target-only,sr-score,sr-lik-exact,sr-lik-typed,sr-lik-loose \
	--latency-strategies target-only,sr-score,sr-lik-typed \
	--opt sr-score.strategy=specreason --opt sr-score.judge=score \
	--opt sr-lik-exact.strategy=specreason --opt sr-lik-exact.judge=likelihood --opt sr-lik-exact.judge.max_rank=1 \
	--opt sr-lik-exact.judge.floor=none --opt sr-lik-exact.judge.math_max_rank=none \
	--opt sr-lik-typed.strategy=specreason --opt sr-lik-typed.judge=likelihood \
	--opt sr-lik-loose.strategy=specreason --opt sr-lik-loose.judge=likelihood --opt sr-lik-loose.judge.floor=-8 \
	--opt sr-lik-loose.judge.math_max_rank=none \
	$(foreach arm,sr-score sr-lik-exact sr-lik-typed sr-lik-loose,--opt $(arm).first_target_steps=0)
BENCH_PLAN_ARMS = --strategies target-only,sr-lik-plan,la-lik --latency-strategies target-only,sr-lik-plan \
	--opt sr-lik-plan.strategy=specreason --opt sr-lik-plan.judge=likelihood --opt sr-lik-plan.first_target_steps=2 \
	--opt la-lik.strategy=lookahead --opt la-lik.judge=likelihood
bench-verify: setup
	$(call bench_run,$(VERIFY_DIR),$(BENCH_COMMON) $(BENCH_VERIFY_ARMS))
	$(call bench_run,$(BENCH_PLAN_DIR),$(BENCH_COMMON) $(BENCH_PLAN_ARMS))

# $(call bench_run,DIR,ARMS): resume the run in DIR, or start it. A resume with MODE=latency
# (or throughput) runs only that mode of the run this time, e.g. latency problems when the
# time at hand is shorter than a throughput wave.
define bench_run
	@if ls $(1)/results_*.json >/dev/null 2>&1; then \
		echo "resuming the run in $(1)"; \
		$(VENV)/bin/stepspec bench --resume $(1)$(if $(MODE), --mode $(MODE)); \
	else \
		$(VENV)/bin/stepspec bench $(2) --output-dir $(1); \
	fi
endef

# Each engine's decode and prefill speed per model x dtype x token-level method on this
# machine, one engine at a time, with its CPU model (the bundled pair's defaults cite it).
ENGINES_DIR ?= benchmarks/measured/engines_cpu
bench-engines: setup
	$(VENV)/bin/python benchmarks/engine_speeds.py --out $(ENGINES_DIR)

# Both engines at once against taking turns, sharing every core or one half each.
bench-contention: setup
	$(VENV)/bin/python benchmarks/engine_contention.py --json $(ENGINES_DIR)/contention.json

# `stepspec serve` (defaults) against vLLM's own server (the 1.5B at its fastest per mode: suffix
# decoding at once, the 0.5B inside it one at a time), the same client and problems: 30 GSM8K
# problems at once and one at a time, fresh servers; each mode a wave (SERVE_MODES picks).
SERVE_MODES ?= concurrent,one_at_a_time
bench-serve: setup
	$(VENV)/bin/python benchmarks/serve_compare.py --limit 30 --latency-limit 30 --modes $(SERVE_MODES) --out benchmarks/measured/serve_gsm8k30_cpu

bench-tokens: setup
	$(VENV)/bin/python benchmarks/token_speculation.py

# The learned router end to end: collect both models' steps on 200 generated
# grade-school problems (resumable: run it again), label each drafted step by the target's
# likelihood verifier (cut or not; resumable), train on that label (tau: as many target
# calls as the verifier's cut share).
# The bundled draft aligned to the bundled target (`stepspec draft align`; resumable: run it
# again to continue). The work folder is committed as the record (solutions, manifest, held-out
# evaluation, model card; not the checkpoints), the adapter goes to engine/adapters/, where the
# qwen2.5-coder-0.5b-aligned preset ships it: `make setup` merges it without training.
ALIGN_DIR ?= benchmarks/measured/align_qwen2.5-coder-0.5b_cpu
align: setup
	$(VENV)/bin/stepspec draft align --output-dir $(ALIGN_DIR) --export engine/adapters/qwen2.5-coder-0.5b-aligned

# The aligned draft beside the unaligned one (issue 53), the first 100 GSM8K test problems
# in waves of 25 under load and the first 30 one at a time: specreason with each draft, the
# governor off in both (it hands every step to the target under load, which would hide the
# drafts), against target-only; every arm's target on suffix decoding (three engines fit this
# machine, four do not), so target-only's one-at-a-time baseline is the target on suffix
# decoding. Resumable like `make bench`.
ALIGNED_DIR ?= benchmarks/measured/aligned_gsm8k100_cpu
ALIGNED_ARMS = --dataset gsm8k --limit 100 --mode both --latency-limit 30 --throughput-wave 25 \
	--max-tokens 640 --kv-cache-gib 1.0 --strategies target-only,specreason,sr-aligned \
	--opt target-only.target_spec=suffix --opt specreason.backoff=false \
	--opt sr-aligned.strategy=specreason --opt sr-aligned.draft=qwen2.5-coder-0.5b-aligned \
	--opt sr-aligned.backoff=false
bench-aligned: setup
	$(call bench_run,$(ALIGNED_DIR),$(ALIGNED_ARMS))

# The frontier (issue 53): specreason letting the target write its first 0, 1 or 2 steps (none
# drafted, not even the opening sentence), the governor off, beside target-only (suffix
# decoding), under load; one run per draft, two engines each. `make bench-frontier` chooses on
# GSM8K 100-129 (problems the reported runs never use), waves of 15; `make bench-frontier-report`
# reports on 0-99, waves of 25. The committed choice predates draft_opening=false (its NOTES.md
# says what its arms were).
FRONTIER_DIR ?= benchmarks/measured/frontier_gsm8k100-129_cpu
FRONTIER_REPORT_DIR ?= benchmarks/measured/frontier_gsm8k100_cpu
frontier_arms = --dataset gsm8k $(1) --mode throughput --max-tokens 640 \
	--kv-cache-gib 2.0 --strategies target-only,sr-f0,sr-f1,sr-f2 --opt target-only.target_spec=suffix \
	$(foreach k,0 1 2,--opt sr-f$(k).strategy=specreason --opt sr-f$(k).first_target_steps=$(k) \
	--opt sr-f$(k).draft_opening=false --opt sr-f$(k).backoff=false)
FRONTIER_ARMS = $(call frontier_arms,--offset 100 --limit 30 --throughput-wave 15)
FRONTIER_REPORT_ARMS = $(call frontier_arms,--limit 100 --throughput-wave 25)
bench-frontier: setup
	$(call bench_run,$(FRONTIER_DIR)/unaligned,$(FRONTIER_ARMS))
	$(call bench_run,$(FRONTIER_DIR)/aligned,$(FRONTIER_ARMS) --draft qwen2.5-coder-0.5b-aligned)
bench-frontier-report: setup
	$(call bench_run,$(FRONTIER_REPORT_DIR)/unaligned,$(FRONTIER_REPORT_ARMS))
	$(call bench_run,$(FRONTIER_REPORT_DIR)/aligned,$(FRONTIER_REPORT_ARMS) --draft qwen2.5-coder-0.5b-aligned)

router: setup
	$(VENV)/bin/stepspec router collect --num-problems 200 --spec none --output-dir runs/router-data
	$(VENV)/bin/stepspec router verify runs/router-data
	$(VENV)/bin/stepspec router train runs/router-data --out runs/router.pt

# The router (ROUTER_FILE: the committed one, trained on benchmarks/measured/router_data_cpu;
# `make router` makes runs/router.pt) beside target-only and specreason on the likelihood
# verifier at two strictnesses (the accuracy/speed curve the router has to reach), the first
# 100 GSM8K problems (throughput) and latency on the first 30; resumable like `make bench`.
# The router and specreason's default both let the target write the first two steps.
ROUTER_FILE ?= benchmarks/measured/router.pt
ROUTER_DIR ?= benchmarks/measured/gsm8k100_router_cpu
ROUTER_ARMS = --strategies target-only,arbitrage,sr-lik,sr-lik-loose --router $(ROUTER_FILE) \
	--latency-strategies target-only,arbitrage,sr-lik --opt arbitrage.first_target_steps=2 \
	--opt sr-lik.strategy=specreason --opt sr-lik.judge=likelihood \
	--opt sr-lik-loose.strategy=specreason --opt sr-lik-loose.judge=likelihood \
	--opt sr-lik-loose.judge.floor=-8 --opt sr-lik-loose.judge.math_max_rank=none
bench-router: setup
	$(call bench_run,$(ROUTER_DIR),$(BENCH_COMMON) $(ROUTER_ARMS))

# The router retrained on generated problems (issue 53: benchmarks/measured/router_data_generated_cpu,
# no gsm_symbolic, whose templates are GSM8K test problems) beside the committed one and
# target-only, the same problems under load, waves of 25; both routers' arms as the router bench
# has them (the target writes the first two steps), the governor off in both (under load it hands
# steps to the target, which would hide the routers), every target on suffix decoding (arbitrage's own
# is the 0.5B inside the target: a third engine, which this machine's memory does not hold), dtype auto.
ROUTER_GEN_FILE ?= benchmarks/measured/router_generated.pt
ROUTER_GEN_DIR ?= benchmarks/measured/router_generated_gsm8k100_cpu
ROUTER_GEN_ARMS = --dataset gsm8k --limit 100 --mode throughput --throughput-wave 25 --max-tokens 640 \
	--kv-cache-gib 2.0 --strategies target-only,arbitrage,arb-generated --router $(ROUTER_FILE) \
	--opt target-only.target_spec=suffix --opt arb-generated.strategy=arbitrage \
	--opt arb-generated.router=$(ROUTER_GEN_FILE) $(foreach a,arbitrage arb-generated,--opt $(a).first_target_steps=2 \
	--opt $(a).backoff=false --opt $(a).target_spec=suffix)
bench-router-generated: setup
	$(call bench_run,$(ROUTER_GEN_DIR),$(ROUTER_GEN_ARMS))

# Speculative tree search and best-of-n on the likelihood verifier against their target-only
# twins (same k, beam, depth; same n, temperature 0.7; in both drafted arms the target writes
# the opening and the plan, first_target_steps=2) on the first 100 GSM8K test problems
# (throughput: accuracy, paired) and latency on the first 30; resumable like `make bench`
# (it takes many hours on this CPU: run it again to go on). Throughput runs in waves of 10
# problems, the four arms in turn per wave, so a stopped run keeps its finished waves and
# each wave's speedup is timed in one session. (benchmarks/measured/gsm8k100_tree_repair_cpu
# holds a run of `tree` that also repaired every cut candidate ending the trace: 46 against 52.)
TREE_DIR ?= benchmarks/measured/gsm8k100_tree_cpu
TREE_ARMS = --strategies tree,tree-target,best-of-n,best-of-n-target --throughput-wave 10 \
	$(foreach arm,tree tree-target,--opt $(arm).k=3 --opt $(arm).beam=2) \
	$(foreach arm,best-of-n best-of-n-target,--opt $(arm).n=5 --opt $(arm).temperature=0.7)
bench-tree: setup
	$(call bench_run,$(TREE_DIR),$(BENCH_COMMON) $(TREE_ARMS))

# Token-level speculation across sibling samples (STAND's idea) inside tree-target and
# best-of-n-target at temperature 0.7: suffix decoding and the draft model against none.
bench-siblings: setup
	$(VENV)/bin/python benchmarks/sibling_speculation.py --json benchmarks/measured/siblings_gsm8k_cpu/siblings.json
