"""Graders on tricky strings, and answer extraction."""

import pytest

from stepspec.orchestrator.steps import last_boxed
from stepspec.workflows.eval.graders import AIMEGrader, GSM8KGrader, MathGrader, NumericGrader, extract_answer, get_grader


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


GSM8K_REF = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 18"

# response, strict extraction, flexible extraction (gold is 18)
GSM8K_CASES = [
    ("She makes 9 * 2 = 18 dollars.\n\n\\boxed{18}", "18", "18"),
    ("\\boxed{\\$18.00}", "18", "18"),  # dollars and trailing zeros
    ("So she makes $18 a day.\n#### 18", "18", "18"),
    ("The answer is $18.", "18", "18"),
    ("The final answer is: 18", "18", "18"),
    ("She makes 18 dollars.", None, "18"),  # no explicit form: only flexible finds it
    ("\\boxed{18} Wait, 16 - 3 = 13 eggs, 13 - 4 = 9, 9 * 2 = 18... no, 20", "18", "20"),
    ("\\boxed{20}\nThe answer is 18", "18", "18"),  # the later of the explicit forms wins
    ("First \\boxed{1,018}", "1018", "1018"),
    ("\\boxed{}", None, None),
    ("I cannot solve this.", None, None),
    ("It costs -$5 then +18.", None, "18"),
]


@pytest.mark.parametrize("response, strict, flexible", GSM8K_CASES)
def test_gsm8k_strict_and_flexible(response, strict, flexible):
    g = GSM8KGrader().grade(response, GSM8K_REF)
    assert g["strict"].extracted == strict and g["strict"].correct == (strict == "18")
    assert g["flexible"].extracted == flexible and g["flexible"].correct == (flexible == "18")


def test_gsm8k_gold():
    grader = GSM8KGrader()
    assert grader.gold("9 * 2 = <<9*2=18>>18\n#### 18") == "18"
    assert grader.gold("... #### 1,000") == "1000"
    assert grader.gold("#### -3") == "-3"
    with pytest.raises(ValueError, match="no number after '####'"):
        grader.gold("no marker or number")


@pytest.mark.parametrize("response, extracted", [
    ("\\boxed{33}", "33"),
    ("\\boxed{033}", "33"),  # AIME answers are written with leading zeros
    ("\\boxed{\\text{33}}", "33"),
    ("\\boxed{33^\\circ}", "33"),
    ("first \\boxed{5} then \\boxed{\\frac{1}{2}}", None),  # the last box is not an integer
    ("\\boxed{1000}", None),  # out of range 0-999
    ("\\boxed{-4}", None),
    ("\\boxed{3.5}", None),
    ("the answer is 33", None),  # AIME needs the box
    ("\\boxed{{33}}", None),
])
def test_aime(response, extracted):
    g = AIMEGrader().grade(response, "033" if extracted == "33" else "33")
    assert g["exact"].extracted == extracted
    assert g["exact"].correct == (extracted == "33")


def test_aime_gold_must_be_an_integer():
    with pytest.raises(ValueError, match="not an integer 0-999"):
        AIMEGrader().gold("x=3")


@pytest.mark.parametrize("reference, response, correct", [
    ("\\frac{1}{2}", "so \\boxed{0.5}", True),
    ("\\frac{1}{2}", "\\boxed{\\dfrac{1}{2}}", True),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\frac{\\pi}{2})}", True),
    ("\\sqrt{2}", "\\boxed{2^{1/2}}", True),
    ("[-2,7]", "\\boxed{[-2, 7]}", True),
    ("x^2+2x+1", "\\boxed{(x+1)^2}", True),
    ("\\text{(C)}", "\\boxed{C}", True),
    ("10", "\\boxed{10\\%}", True),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}", False),
    ("(3, 4)", "\\boxed{(4, 3)}", False),
    ("5", "The answer is 5", False),  # MATH answers are read from the box
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt{3}}{2}}", True),
])
def test_math_equivalence(reference, response, correct):
    assert MathGrader().grade(response, reference)["math_verify"].correct is correct


@pytest.mark.parametrize("reference, response, correct", [
    ("42", "so \\boxed{42}", True),
    ("1,000", "it is 1000", True),
    ("42", "\\boxed{41}", False),
    ("blue", "\\boxed{blue}", True),
    ("blue", "blue", False),
])
def test_numeric_grader_for_user_files(reference, response, correct):
    assert NumericGrader().grade(response, reference)["exact"].correct is correct


def test_unknown_grader():
    with pytest.raises(ValueError, match="unknown grader 'gsm'"):
        get_grader("gsm")
