import pytest

from stepspec.orchestrator.steps import StepRules, TextCalls, find_answer, inside_code_block, last_boxed, split_steps


def test_split_on_blank_lines():
    text = "Step one.\n\nStep two.\n\n\n\nStep three."
    assert split_steps(text) == ["Step one.", "Step two.", "Step three."]


def test_blank_line_inside_a_code_block_does_not_end_the_step():
    text = "Let me write code.\n\n```python\ndef f():\n\n    return 1\n```\n\nSo f() is 1."
    assert split_steps(text) == [
        "Let me write code.",
        "```python\ndef f():\n\n    return 1\n```",
        "So f() is 1.",
    ]


def test_unterminated_code_block_ends_the_last_step():
    text = "Plan.\n\n```\nx = 1\n\ny = 2"
    assert split_steps(text) == ["Plan.", "```\nx = 1\n\ny = 2"]
    assert inside_code_block("```\nx = 1\n\ny") and not inside_code_block("```x```")


def test_numbered_lists_with_a_custom_delimiter():
    text = "1. Sixteen eggs.\n2. Three eaten.\n3. Nine left."
    assert split_steps(text, "\n") == ["1. Sixteen eggs.", "2. Three eaten.", "3. Nine left."]
    assert split_steps(text) == [text]  # no blank line: one step


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so \\boxed{18}.", "18"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{1} and later \\boxed{unclosed", "1"),  # the last closed box
        ("The answer is 42.", "42"),
        ("the final answer is: $1,200", "1,200"),
        ("The answer is 3 apples, no wait, the answer is 5.", "5"),
        ("No final answer here.", None),
        ("", None),
    ],
)
def test_find_answer(text, expected):
    assert find_answer(text) == expected


def test_boxed_wins_over_the_sentence():
    assert find_answer("The answer is 3. \\boxed{4}") == "4"
    assert last_boxed("\\boxed{a{b}c}") == "a{b}c"


def test_custom_answer_pattern_and_bad_rules():
    rules = StepRules(answer_patterns=(r"ANSWER:\s*(?P<answer>\w+)",))
    assert find_answer("... ANSWER: blue", rules) == "blue"
    with pytest.raises(ValueError, match="named group"):
        StepRules(answer_patterns=(r"ANSWER: (\w+)",))
    with pytest.raises(ValueError, match="not a valid regex"):
        StepRules(answer_patterns=(r"(?P<answer>",))
    with pytest.raises(ValueError, match="non-empty"):
        StepRules(delimiter="")


def test_a_call_rule_finds_calls_stops_before_their_result_and_is_checked():
    rules = StepRules(calls=TextCalls(r"(?m)^Action:", "Observation:"))
    assert rules.holds_call("I look it up.\nAction: search(tea)") and not rules.holds_call("No Action: here")
    assert rules.stops == ("\n\n", "</think>", "Observation:") and StepRules().stops == ("\n\n", "</think>")
    assert not StepRules().holds_call("Action: search(tea)")
    with pytest.raises(ValueError, match="not a call rule"):
        StepRules(calls=r"Action:")  # a pattern alone: the rule needs its stop and check too
    with pytest.raises(ValueError, match="call start '\\(' is not a valid regex"):
        StepRules(calls=TextCalls("(", "Observation:"))


def test_answers_and_thinking_blocks():
    from stepspec.orchestrator.steps import inside_thinking

    # the answer after </think> wins over a boxed guess while thinking
    assert find_answer("<think>maybe \\boxed{17}</think>So the total is \\boxed{18}.") == "18"
    # nothing after </think>: the thinking's own answer is still found
    assert find_answer("<think>so \\boxed{17}</think>\n") == "17"
    assert inside_thinking("<|im_start|>assistant\n<think>\nfirst, 16 - 3")
    assert not inside_thinking("<think>a</think> b") and not inside_thinking("no tags at all")
    custom = StepRules(think_start="<reasoning>", think_end="</reasoning>")
    assert inside_thinking("<reasoning> so", custom)
    with pytest.raises(ValueError, match="think tags"):
        StepRules(think_end="")
