"""Token-level speculation under the vLLM backend, on a tiny random model.

The tiny model's greedy output is repetitive, so n-gram and suffix lookup find
real matches; used as its own draft model it must have every token accepted.
"""

import json

import pytest

from conftest import tiny_engine
from stepspec.engine.speculation import speculative_config
from stepspec.engine.types import FinishReason, GenerationRequest, Sampling, Structured

pytestmark = pytest.mark.vllm

PROMPTS = [
    "Step 1: 48 / 2 = 24. Step 2:",
    "How many clips did Natalia sell altogether in April and May?",
    "Let me check: 12 / 60 = 0.2 per minute",
]
MAX_TOKENS = 48


def run_greedy(runner, engine):
    requests = [GenerationRequest(p, Sampling(max_tokens=MAX_TOKENS)) for p in PROMPTS]
    runner.run(engine.start())
    try:
        before = engine.stats().spec_decoding
        results = runner.run(engine.generate(requests))
        delta = engine.stats().spec_decoding.minus(before)
    finally:
        runner.run(engine.close())
    return [r.completion for r in results], delta


@pytest.fixture(scope="module")
def reference(tiny_model_path, runner):
    completions, delta = run_greedy(runner, tiny_engine(tiny_model_path, name="plain"))
    assert delta.num_drafts == 0
    return [c.token_ids for c in completions]


def assert_counters_add_up(stats, k):
    assert stats.num_spec_tokens == k
    assert stats.num_drafts > 0 and stats.num_draft_tokens > 0
    assert stats.num_draft_tokens <= k * stats.num_drafts
    assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    assert len(stats.num_accepted_tokens_per_pos) <= k
    # a position is only accepted if every earlier one was
    per_pos = stats.num_accepted_tokens_per_pos
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))
    assert 0 < stats.acceptance_rate <= 1
    assert 1 < stats.mean_acceptance_length <= k + 1


@pytest.mark.parametrize(
    "method,k",
    [("ngram", 3), ("suffix", 4)],
)
def test_lookup_speculation_is_token_identical_and_counts_acceptance(
    method, k, tiny_model_path, runner, reference
):
    config = speculative_config(method, num_speculative_tokens=k)
    engine = tiny_engine(tiny_model_path, name=method, speculative_config=config)
    assert engine.info.speculative_method == method
    completions, delta = run_greedy(runner, engine)
    assert [c.token_ids for c in completions] == reference
    assert_counters_add_up(delta, k)
    # per-completion counters (vLLM per-request metrics) add up to the engine's
    per_request = [c.spec_decoding for c in completions]
    assert all(s is not None for s in per_request)
    assert sum(s.num_accepted_tokens for s in per_request) == delta.num_accepted_tokens
    assert sum(s.num_draft_tokens for s in per_request) == delta.num_draft_tokens


def test_model_as_its_own_draft_accepts_everything(tiny_model_path, runner, reference):
    config = speculative_config("draft", draft_model=str(tiny_model_path), num_speculative_tokens=3)
    engine = tiny_engine(tiny_model_path, name="self-draft", speculative_config=config)
    assert engine.info.speculative_method == "draft_model"
    completions, delta = run_greedy(runner, engine)
    assert [c.token_ids for c in completions] == reference
    assert_counters_add_up(delta, 3)
    assert delta.num_accepted_tokens == delta.num_draft_tokens
    assert delta.acceptance_rate == 1.0
    assert delta.num_accepted_tokens_per_pos == [delta.num_drafts] * 3


def test_a_request_a_stop_string_ends_reports_its_counters(tiny_model_path, runner):
    # vLLM finds stop strings in the front end and aborts the request in the core, which sent
    # counters only with a request it finished itself (stepspec/engine/stop_string_metrics.py).
    config = speculative_config("draft", draft_model=str(tiny_model_path), num_speculative_tokens=3)
    engine = tiny_engine(tiny_model_path, name="self-draft-stop", speculative_config=config)
    runner.run(engine.start())
    try:
        [whole] = runner.run(engine.generate([GenerationRequest(PROMPTS[0], Sampling(max_tokens=MAX_TOKENS))]))
        text = whole.completion.text
        stop = text[len(text) // 2:len(text) // 2 + 6]
        before = engine.stats().spec_decoding
        [stopped] = runner.run(engine.generate([GenerationRequest(PROMPTS[0], Sampling(max_tokens=MAX_TOKENS,
                                                                                           stop=(stop,)))]))
        delta = engine.stats().spec_decoding.minus(before)
    finally:
        runner.run(engine.close())
    c = stopped.completion
    assert c.stop_string == stop and c.num_output_tokens < MAX_TOKENS
    counters = c.spec_decoding
    assert counters is not None and counters.num_drafts > 0
    # every drafted token is accepted (the model drafts for itself): a pass writes 3 + 1 tokens,
    # the first token comes from the prefill, and the last pass wrote at least the stop string's end
    assert counters.num_accepted_tokens == counters.num_draft_tokens == 3 * counters.num_drafts
    assert (c.num_output_tokens - 1) / 4 <= counters.num_drafts <= (c.num_output_tokens - 1) / 4 + 2
    # the engine saw these passes (and perhaps one more, run before the abort reached the core)
    assert counters.num_drafts <= delta.num_drafts <= counters.num_drafts + 1


def test_unknown_speculation_method_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown speculation method 'medusa2'"):
        speculative_config("medusa2")
    with pytest.raises(ValueError, match="needs a draft model"):
        speculative_config("draft")


BOUND = {"type": "object", "properties": {"unit": {"enum": ["eggs", "clips"]}, "ok": {"type": "boolean"}},
         "required": ["unit", "ok"], "additionalProperties": False}


@pytest.mark.parametrize("method", ["none", "ngram", "suffix", "draft"])
def test_a_bound_generation_follows_its_schema_under_each_token_method(method, tiny_model_path, runner):
    """Structured outputs (a tool call's schema) compose with token-level speculation: whatever the
    engine drafts, the text it returns is the schema's, and the grammar ends it. (Without
    whitespace between JSON tokens: a random model would pad with it up to the budget.)"""
    import jsonschema
    from vllm.config import StructuredOutputsConfig

    config = speculative_config(method, num_speculative_tokens=3,
                                draft_model=str(tiny_model_path) if method == "draft" else None)
    engine = tiny_engine(tiny_model_path, name=f"bound-{method}", speculative_config=config, engine_args={
        "enforce_eager": True, "structured_outputs_config": StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)})
    bound = Sampling(max_tokens=MAX_TOKENS, structured=Structured(json=json.dumps(BOUND)))
    runner.run(engine.start())
    try:
        results = runner.run(engine.generate([GenerationRequest(p, bound) for p in PROMPTS]))
    finally:
        runner.run(engine.close())
    for r in results:
        c = r.completion
        assert c.finish_reason is FinishReason.EOS, c.text
        jsonschema.validate(json.loads(c.text), BOUND)
