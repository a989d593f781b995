import pytest

from stepspec.engine.types import NextTokenDistribution
from stepspec.judges.digit_score import digit_probabilities, read_score


def dist(*entries):
    return NextTokenDistribution(top=tuple((i, t, lp) for i, (t, lp) in enumerate(entries)), num_prompt_tokens=10)


def test_worked_example_from_the_docstring():
    d = dist(("7", -0.36), ("8", -1.20), ("6", -2.30), ("The", -4.0))
    probs = digit_probabilities(d)
    assert set(probs) == {6, 7, 8} and sum(probs.values()) == pytest.approx(1.0)
    assert read_score(d, "expected") == pytest.approx(7.18, abs=0.005)
    assert read_score(d, "argmax") == 7.0


def test_spaced_digits_and_multi_digit_tokens():
    d = dist((" 9", -0.1), ("9", -0.2), ("10", -0.3), ("0", -5.0))
    probs = digit_probabilities(d)
    assert set(probs) == {0, 9}  # " 9" and "9" are one digit; "10" is not a 0-9 score
    assert probs[9] > 0.99


def test_no_digit_means_no_score_and_bad_method_is_an_error():
    assert read_score(dist(("The", -0.1), ("I", -1.0))) is None
    with pytest.raises(ValueError, match="unknown score method"):
        read_score(dist(("5", -0.1)), "median")
