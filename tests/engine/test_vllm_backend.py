"""The in-process vLLM backend on a tiny random model: real vLLM, seconds per engine."""

import asyncio
import os

import pytest

from conftest import tiny_engine
from stepspec.engine.protocol import Engine, EngineError
from stepspec.engine.types import FinishReason, GenerationRequest, Sampling

pytestmark = pytest.mark.vllm
LD_PRELOAD_AT_IMPORT = os.environ.get("LD_PRELOAD")  # before any engine of this module starts

PROMPTS = [
    "Step 1: 48 / 2 = 24. Step 2:",
    "How many clips did Natalia sell altogether in April and May?",
    "def solve():\n    return",
]


@pytest.fixture(scope="module")
def base(tiny_model_path, runner):
    engine = tiny_engine(tiny_model_path, name="tiny")
    runner.run(engine.start())
    yield engine
    runner.run(engine.close())


def test_vllms_processes_run_intel_openmp_and_the_callers_environment_is_kept(base):
    """On the CPU build the processes that run the model load Intel OpenMP (LD_PRELOAD set
    while vLLM spawns them), without a Makefile; the caller's LD_PRELOAD is left as it was."""
    import psutil

    from stepspec.engine.vllm_runtime import INTEL_OPENMP, is_cpu_build

    if not is_cpu_build():
        pytest.skip("the CUDA build's processes keep their own OpenMP")
    assert os.environ.get("LD_PRELOAD") == LD_PRELOAD_AT_IMPORT
    children = psutil.Process().children(recursive=True)
    loaded = {c.pid: any(m.path == INTEL_OPENMP for m in c.memory_maps()) for c in children}
    assert loaded and all(loaded.values()), loaded


def test_vllms_threads_run_on_the_cores_this_process_may_use(base, monkeypatch):
    """OpenMP threads bind to the allowed cores (under `taskset -c 2,3`: 2 and 3, not the
    machine's first two); the engine's processes stay inside this process's cores."""
    import psutil

    from stepspec.engine.vllm_runtime import allowed_cpus

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 2})
    assert allowed_cpus() == "2,3"
    monkeypatch.undo()
    mine = set(os.sched_getaffinity(0))
    bound = {c.pid: set(c.cpu_affinity()) for c in psutil.Process().children(recursive=True)}
    assert bound and all(cores <= mine for cores in bound.values()), (mine, bound)


def greedy(max_tokens=32, **kw):
    return Sampling(max_tokens=max_tokens, temperature=0.0, **kw)


def test_implements_the_engine_protocol(base):
    assert isinstance(base, Engine)
    assert base.info.backend == "vllm" and base.info.speculative_method is None


def test_greedy_generation_length_and_token_ids(base, runner):
    (r,) = runner.run(base.generate([GenerationRequest(PROMPTS[0], greedy(24))]))
    c = r.completion
    assert c.finish_reason is FinishReason.LENGTH
    assert c.num_output_tokens == 24 == len(c.token_ids)
    # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8
    # sequence that a full decode shows as U+FFFD; otherwise the texts agree.
    decoded = base.tokenizer.decode(list(c.token_ids))
    assert decoded.startswith(c.text) and len(decoded) - len(c.text) <= 2
    assert r.num_prompt_tokens == base.count_tokens(PROMPTS[0])


def test_batch_results_come_back_in_order_and_match_single_calls(base, runner):
    batch = runner.run(base.generate([GenerationRequest(p, greedy(16)) for p in PROMPTS]))
    singles = [runner.run(base.generate([GenerationRequest(p, greedy(16))]))[0] for p in PROMPTS]
    assert [r.completion.token_ids for r in batch] == [r.completion.token_ids for r in singles]


def test_concurrent_callers_share_the_engine(base, runner):
    async def both():
        return await asyncio.gather(
            base.generate([GenerationRequest(PROMPTS[0], greedy(12))]),
            base.generate([GenerationRequest(PROMPTS[1], greedy(12))]),
        )

    a, b = runner.run(both())
    (a1,) = runner.run(base.generate([GenerationRequest(PROMPTS[0], greedy(12))]))
    assert a[0].completion.token_ids == a1.completion.token_ids
    assert b[0].completion.num_output_tokens == 12


def test_token_id_prompt_equals_text_prompt(base, runner):
    ids = base.encode(PROMPTS[1])
    text_r, ids_r = runner.run(
        base.generate([GenerationRequest(PROMPTS[1], greedy(16)), GenerationRequest(ids, greedy(16))])
    )
    assert text_r.completion.token_ids == ids_r.completion.token_ids


def test_stop_string_ends_the_completion(base, runner):
    (free,) = runner.run(base.generate([GenerationRequest(PROMPTS[0], greedy(40))]))
    text = free.completion.text
    stop = text[10:14]
    assert stop.strip(), f"need a visible stop string from {text!r}"
    (r,) = runner.run(base.generate([GenerationRequest(PROMPTS[0], greedy(40, stop=(stop, "@@never@@")))]))
    c = r.completion
    assert c.finish_reason is FinishReason.STOP and c.stop_string == stop
    assert c.text == text[: text.index(stop)]
    (r2,) = runner.run(
        base.generate([GenerationRequest(PROMPTS[0], greedy(40, stop=(stop,), include_stop_str=True))])
    )
    assert r2.completion.text == text[: text.index(stop) + len(stop)]


def test_sampling_with_n_and_seed_is_reproducible(base, runner):
    spec = Sampling(max_tokens=12, temperature=1.0, n=3, seed=7)
    (a,) = runner.run(base.generate([GenerationRequest(PROMPTS[1], spec)]))
    (b,) = runner.run(base.generate([GenerationRequest(PROMPTS[1], spec)]))
    assert len(a.completions) == 3
    assert [c.token_ids for c in a.completions] == [c.token_ids for c in b.completions]
    assert a.num_output_tokens == 36


def test_logprobs_of_greedy_tokens_are_the_argmax(base, runner):
    (r,) = runner.run(base.generate([GenerationRequest(PROMPTS[0], greedy(8, logprobs=5))]))
    lps = r.completion.logprobs
    assert len(lps) == 8
    for tok, lp in zip(r.completion.token_ids, lps):
        assert lp.token_id == tok
        assert lp.logprob <= 0
        best = max(lp.top, key=lambda e: e[2])
        assert best[0] == tok and best[2] == pytest.approx(lp.logprob, abs=1e-5)


def test_next_token_logprobs_match_the_first_greedy_token(base, runner):
    (d,) = runner.run(base.next_token_logprobs([PROMPTS[2]], top_k=10))
    (r,) = runner.run(base.generate([GenerationRequest(PROMPTS[2], greedy(1))]))
    assert len(d.top) == 10
    assert [e[2] for e in d.top] == sorted((e[2] for e in d.top), reverse=True)
    assert d.top[0][0] == r.completion.token_ids[0]
    with pytest.raises(EngineError, match="max_logprobs"):
        runner.run(base.next_token_logprobs([PROMPTS[2]], top_k=50))


def test_prefix_cache_serves_a_repeated_prompt(base, runner):
    prompt = " ".join(PROMPTS) * 4  # several KV blocks long
    runner.run(base.generate([GenerationRequest(prompt, greedy(2))]))
    (again,) = runner.run(base.generate([GenerationRequest(prompt + " Step 3:", greedy(2))]))
    assert again.num_cached_prompt_tokens and again.num_cached_prompt_tokens >= 16


def test_chat_template_can_leave_the_assistant_turn_open(base):
    closed = base.apply_chat_template([{"role": "user", "content": "Rate it."}])
    assert closed.endswith("<|im_start|>assistant\n")
    open_turn = base.apply_chat_template(
        [{"role": "user", "content": "Rate it."}, {"role": "assistant", "content": "Score:"}],
        continue_final_message=True,
    )
    assert open_turn.endswith("Score:")


def test_over_long_prompt_is_a_clear_error(base, runner):
    long_prompt = list(range(5, 105)) * 6  # 600 token ids > max_model_len 512
    with pytest.raises(EngineError) as e:
        runner.run(base.generate([GenerationRequest(long_prompt, greedy(4))]))
    assert "600 tokens" in str(e.value) and "max_model_len is 512" in str(e.value)


def test_stats_add_up(base, runner):
    before = base.stats()
    rs = runner.run(base.generate([GenerationRequest(p, greedy(5)) for p in PROMPTS]))
    after = base.stats()
    assert after.num_requests - before.num_requests == 3
    assert after.num_output_tokens - before.num_output_tokens == 15
    assert after.num_prompt_tokens - before.num_prompt_tokens == sum(r.num_prompt_tokens for r in rs)
    assert after.peak_rss_bytes and after.peak_rss_bytes > 100 * 2**20
    assert after.spec_decoding.num_drafts == 0  # no speculation configured


def test_unknown_engine_argument_is_a_clear_error(tiny_model_path, runner):
    engine = tiny_engine(tiny_model_path, engine_args={"enforce_eager": True, "no_such_arg": 1})
    with pytest.raises(EngineError, match="unknown vLLM engine argument"):
        runner.run(engine.start())


def test_missing_model_folder_is_a_clear_error(tmp_path, runner):
    engine = tiny_engine(tmp_path / "nowhere")
    with pytest.raises(EngineError, match="model folder .*nowhere' does not exist"):
        runner.run(engine.start())


def test_a_folder_that_is_not_a_model_is_a_clear_error(tmp_path, runner):
    (tmp_path / "config.json").write_text("{}")
    engine = tiny_engine(tmp_path)
    with pytest.raises(EngineError, match="could not start vLLM"):
        runner.run(engine.start())


def test_score_judge_on_real_vllm_reuses_the_cached_reasoning_prefix(base, runner):
    from stepspec.judges.base import StepCandidate
    from stepspec.judges.score import ScoreJudge
    from stepspec.orchestrator.prompts import opening_messages

    judge = ScoreJudge(base, threshold=5)
    question = "Natalia sold 48 clips in April and half as many in May. How many in all?"
    steps = ("In May she sold 48 / 2 = 24 clips.",) * 3
    first = StepCandidate(question, steps, "So she sold 48 + 24 = 72 clips.", opening_messages=opening_messages(question))
    second = StepCandidate(question, steps, "So she sold 48 + 24 = 73 clips.", opening_messages=opening_messages(question))
    (v1,) = runner.run(judge.judge([first]))
    before = base.stats()
    (v2,) = runner.run(judge.judge([second]))
    after = base.stats()
    for v in (v1, v2):
        assert v.judge == "score" and v.num_judge_calls == 1
        assert v.score is None or 0 <= v.score <= 9
        assert v.accept == (v.score is not None and v.score >= 5)
    assert runner.run(judge.prompt(first)).endswith("Score:")
    # the second judgement shares the question and earlier steps with the first
    assert after.num_cached_prompt_tokens - before.num_cached_prompt_tokens >= 16


def test_continuation_scores_read_the_prefix_cache_and_equal_a_cache_free_computation(base, runner):
    """One prefill scores a given continuation; with the prefix cached, the positions past
    it equal a computation with nothing cached (the cached positions are never read)."""
    from stepspec.engine.types import ContinuationRequest

    prefix = PROMPTS[1] * 3  # long enough that whole KV blocks of it get cached
    (gen,) = runner.run(base.generate([GenerationRequest(prefix, greedy(12))]))
    greedy_ids = gen.completion.token_ids
    requests = [ContinuationRequest(prefix, greedy_ids, top_k=3),
                ContinuationRequest(prefix, tuple(reversed(greedy_ids)), top_k=3)]
    cached = runner.run(base.score_continuations(requests))  # the generate call cached the prefix
    runner.run(base.reset_caches())
    fresh = runner.run(base.score_continuations(requests))
    assert cached[0].num_cached_prompt_tokens > 0 and fresh[0].num_cached_prompt_tokens == 0
    for got, want, r in zip(cached, fresh, requests):
        assert [t.token_id for t in got.tokens] == [t.token_id for t in want.tokens] == list(r.continuation)
        for a, b in zip(got.tokens, want.tokens):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4) and a.rank == b.rank
            assert [t for t, _ in a.top] == [t for t, _ in b.top] and len(a.top) == 3
            assert a.top[0][1] >= a.top[1][1] >= a.top[2][1]
    # a greedy continuation is the model's own top choice at every position; its reverse is not
    assert all(t.rank == 1 and t.top[0][0] == t.token_id for t in cached[0].tokens)
    assert any(t.rank > 1 for t in cached[1].tokens)


def test_continuation_positions_the_cache_hides_are_scored_without_a_prefill_of_the_prefix(base, runner):
    """Text the engine wrote after a prefix is cached past the prefix, so vLLM's prompt
    logprobs of its first tokens are garbage; those positions are computed afresh, one token
    each, and the scores equal a computation with nothing cached."""
    from stepspec.engine.types import ContinuationRequest

    prefix = PROMPTS[1] * 3
    (gen,) = runner.run(base.generate([GenerationRequest(prefix, greedy(40))]))
    written = gen.completion.token_ids
    requests = [ContinuationRequest(prefix, written, top_k=3),  # all of it written before
                ContinuationRequest(prefix, written[:30] + tuple(reversed(written[30:])), top_k=3)]
    before = base.stats()
    cached = runner.run(base.score_continuations(requests))
    after = base.stats()
    num_prefix = gen.num_prompt_tokens
    assert cached[0].num_cached_prompt_tokens > num_prefix + 8  # the hit reaches into the continuation
    # the hidden positions cost one-token requests on cached prompts, not a prefill of the prefix
    assert after.num_prompt_tokens - before.num_prompt_tokens > 2 * num_prefix
    assert (after.num_prompt_tokens - after.num_cached_prompt_tokens) - (
        before.num_prompt_tokens - before.num_cached_prompt_tokens) < num_prefix
    runner.run(base.reset_caches())
    fresh = runner.run(base.score_continuations(requests))
    for got, want, r in zip(cached, fresh, requests):
        assert [t.token_id for t in got.tokens] == [t.token_id for t in want.tokens] == list(r.continuation)
        for a, b in zip(got.tokens, want.tokens):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4) and a.rank == b.rank
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert all(t.rank == 1 for t in cached[0].tokens)
    assert any(t.rank > 1 for t in cached[1].tokens[30:])


def test_a_continuation_past_the_context_window_is_a_clear_error(base, runner):
    from stepspec.engine.types import ContinuationRequest

    with pytest.raises(EngineError, match="prefix \\+ continuation is .* max_model_len"):
        runner.run(base.score_continuations([ContinuationRequest("x", tuple(range(5, 5 + base.max_model_len)))]))
