"""tests/support/greedy_match.py: what the pair tests accept as "the same greedy tokens"."""

import pytest

from stepspec.engine.types import Completion, FinishReason, TokenLogprob
from greedy_match import BF16_TIE, greedy_mismatch


def plain(ids, tops):
    """A plain greedy run writing ``ids``, with ``tops[i]`` its (token, logprob) candidates at i."""
    logprobs = tuple(TokenLogprob(t, str(t), dict(top)[t], tuple((tid, str(tid), lp) for tid, lp in top))
                     for t, top in zip(ids, tops))
    return Completion(text="", token_ids=tuple(ids), finish_reason=FinishReason.LENGTH, logprobs=logprobs)


CLEAR, TIED = ((1, -0.1), (2, -3.0)), ((1, -0.60), (2, -0.60 - BF16_TIE / 2))
WANT = plain((1, 1, 1), (CLEAR, TIED, CLEAR))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_same_tokens_match_in_any_dtype(dtype):
    assert greedy_mismatch((1, 1, 1), WANT, dtype) is None
    assert "2 tokens against 3" in greedy_mismatch((1, 1), WANT, dtype)


def test_float32_allows_no_difference_even_at_a_tie():
    assert "token 1 differs" in greedy_mismatch((1, 2, 5), WANT, "float32")


def test_bfloat16_allows_the_runner_up_of_a_near_tie_and_nothing_after_it_is_compared():
    assert greedy_mismatch((1, 2, 5), WANT, "bfloat16") is None


def test_bfloat16_rejects_a_difference_at_a_clear_choice_or_outside_the_top():
    assert "not a tie" in greedy_mismatch((2, 1, 1), WANT, "bfloat16")
    assert "not among" in greedy_mismatch((1, 7, 1), WANT, "bfloat16")


def test_bfloat16_needs_the_plain_runs_logprobs_to_judge_a_difference():
    bare = Completion(text="", token_ids=(1, 1, 1), finish_reason=FinishReason.LENGTH)
    assert greedy_mismatch((1, 1, 1), bare, "bfloat16") is None
    with pytest.raises(ValueError, match="needs logprobs"):
        greedy_mismatch((1, 2, 1), bare, "bfloat16")
