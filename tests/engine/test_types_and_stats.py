import pytest

from stepspec.engine.stats import EngineStats, SpecDecodingStats
from stepspec.engine.types import GenerationRequest, NextTokenDistribution, Sampling


def test_sampling_spec_validates_and_normalizes():
    assert Sampling(stop="\n\n").stop == ("\n\n",)  # a lone string is one stop string
    assert Sampling(stop=["a", "b"]).stop == ("a", "b")
    for bad in (dict(max_tokens=0), dict(n=0), dict(temperature=-1), dict(top_p=0)):
        with pytest.raises(ValueError):
            Sampling(**bad)


def test_request_prompt_ids_become_a_tuple():
    assert GenerationRequest([1, 2, 3]).prompt == (1, 2, 3)
    assert GenerationRequest("text").prompt == "text"


def test_spec_decoding_stats_worked_example_from_docstring():
    # draft 1: 3 proposed, positions 0,1 accepted; draft 2: 3 proposed, all accepted
    s = SpecDecodingStats(num_spec_tokens=3)
    s.observe_draft(3, [1, 1, 0])
    s.observe_draft(3, [1, 1, 1])
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (2, 6, 5)
    assert s.num_accepted_tokens_per_pos == [2, 2, 1]
    assert s.acceptance_rate == pytest.approx(5 / 6)
    assert s.mean_acceptance_length == pytest.approx(3.5)
    assert s.acceptance_rate_per_pos == [1.0, 1.0, 0.5]


def test_spec_decoding_stats_empty_and_difference():
    empty = SpecDecodingStats()
    assert empty.acceptance_rate is None and empty.mean_acceptance_length is None
    s = SpecDecodingStats(num_spec_tokens=2)
    s.observe_draft(4, [2, 1], num_drafts=2)
    before = s.copy()
    s.observe_draft(2, [1, 0])
    delta = s.minus(before)
    assert (delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens) == (1, 2, 1)
    assert delta.num_accepted_tokens_per_pos == [1, 0]
    total = SpecDecodingStats()
    total.observe(before)
    total.observe(delta)
    assert total.to_dict() == {**s.to_dict(), "num_spec_tokens": 2}


def test_engine_stats_rates():
    e = EngineStats()
    assert e.output_tokens_per_second is None
    e.observe_call(2, 100, 40, 50, 2.0)
    e.observe_call(1, 10, 0, 10, 1.0)
    assert e.num_requests == 3 and e.num_cached_prompt_tokens == 40
    assert e.output_tokens_per_second == pytest.approx(20.0)
    assert e.to_dict()["spec_decoding"]["num_drafts"] == 0


def test_next_token_distribution_reads_digit_tokens():
    d = NextTokenDistribution(top=((20, " 7", -0.1), (21, "7", -0.5), (22, "8", -2.0)), num_prompt_tokens=9)
    assert d.logprob_of("7") == -0.1
    assert d.by_text() == {"7": -0.1, "8": -2.0}
    assert d.logprob_of("9") is None


def test_from_histogram_worked_example():
    s = SpecDecodingStats.from_histogram(3, [1, 0, 2, 5], num_draft_tokens=24)
    assert s.num_drafts == 8 and s.num_accepted_tokens == 19
    assert s.num_accepted_tokens_per_pos == [7, 7, 5]
    assert s.mean_acceptance_length == pytest.approx(1 + 19 / 8)


def test_finish_reason_from_vllm():
    from stepspec.engine.types import FinishReason

    assert FinishReason.from_vllm("length", None) == (FinishReason.LENGTH, None)
    assert FinishReason.from_vllm("stop", "\n\n") == (FinishReason.STOP, "\n\n")
    assert FinishReason.from_vllm("stop", None) == (FinishReason.EOS, None)
    assert FinishReason.from_vllm("stop", 151645) == (FinishReason.EOS, None)  # a stop token id
    with pytest.raises(ValueError, match="finish_reason='abort'"):
        FinishReason.from_vllm("abort", None)
