import pytest

from orchestrator.steps import last_boxed
from workflows.answers import extract_answer, gsm8k_reference


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so the answer is \\boxed{18}.", "18"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # last box, nested braces
        ("no box here", None),
        ("\\boxed{unclosed", None),
        ("\\boxed{1} then \\boxed{unclosed", "1"),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("She makes $18 every day. \\boxed{18}", "18"),
        ("Total: \\boxed{1,234}", "1234"),
        ("The answer is 3.50 dollars", "3.5"),
        ("-5 degrees", "-5"),
        ("nothing numeric", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_gsm8k_reference():
    assert gsm8k_reference("9 * 2 = <<9*2=18>>18\n#### 18") == "18"
    assert gsm8k_reference("... #### 1,000") == "1000"
    with pytest.raises(ValueError):
        gsm8k_reference("no marker")


def test_trace_answer_is_canonical_and_only_from_a_found_answer():
    from orchestrator.trace import StepRecord, Trace
    from workflows.answers import trace_answer

    def trace(*texts, answer):
        steps = tuple(StepRecord(i, "target", t) for i, t in enumerate(texts))
        return Trace("q", "target-only", steps, answer=answer, stop_reason="answer", seconds=0.0)

    assert trace_answer(trace("She sells 1,000 eggs.", "\\boxed{\\$1,000.00}", answer="\\$1,000.00")) == "1000"
    assert trace_answer(trace("16 - 3 = 13", answer=None)) is None
