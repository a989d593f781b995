"""Judged token acceptance inside vLLM's token-level speculation (stepspec.engine.token_accept).

Here: the rule's arithmetic on logits, its declaration and its wiring. On the real pair:
``test_pair.py::test_judged_token_acceptance_on_the_pair``.
"""

from importlib.metadata import entry_points

import pytest

from stepspec.engine.config import EnginePair, VLLMEngineConfig
from stepspec.engine.token_accept import ADDITIONAL_KEY, AcceptRule


@pytest.fixture
def judged(torch):
    from stepspec.engine.token_accept import judged_argmax_logits  # imports torch

    return judged_argmax_logits


def logits_of(torch, rows):
    """[tokens, 6] logits from per-row lists of (token, logit); the rest -10."""
    out = torch.full((len(rows), 6), -10.0)
    for i, row in enumerate(rows):
        for token, logit in row:
            out[i, token] = logit
    return out


def test_a_second_choice_is_kept_where_the_rule_allows_and_the_rest_stay_the_targets(torch, judged):
    # row 0: drafted 2 is the target's 2nd choice -> kept; row 1: drafted 3 is its 3rd -> not;
    # row 2: drafted 1 is the 1st already -> untouched
    logits = logits_of(torch, [[(1, 2.0), (2, 1.5)], [(1, 2.0), (2, 1.5), (3, 1.0)], [(1, 2.0), (2, 1.0)]])
    raised = judged(logits, torch.tensor([2, 3, 1]), None, AcceptRule(max_rank=2), None)
    assert raised == 1
    assert logits.argmax(dim=1).tolist() == [2, 1, 1]


def test_the_floor_and_the_math_rule_hold_a_second_choice_back(torch, judged):
    two_close = [(1, 2.0), (2, 1.9)]  # the 2nd choice at about -0.74
    far = [(1, 8.0), (2, 1.0)]  # the 2nd choice at about -7
    logits = logits_of(torch, [two_close, far, two_close])
    math = torch.tensor([False, False, False, False, False, True])
    logits[2, 5], logits[2, 2] = 1.9, -10.0  # row 2 drafts token 5 (a digit) as its 2nd choice
    raised = judged(logits, torch.tensor([2, 2, 5]), None, AcceptRule(max_rank=2, floor=-3.0, math_max_rank=1), math)
    assert raised == 1
    assert logits.argmax(dim=1).tolist() == [2, 1, 1]


def test_math_target_holds_a_second_choice_where_the_targets_own_holds_a_digit(torch, judged):
    # both rows draft token 2 (no digit) as the 2nd choice; row 1's likeliest is token 5, a digit
    logits = logits_of(torch, [[(1, 2.0), (2, 1.9)], [(5, 2.0), (2, 1.9)]])
    math = torch.tensor([False, False, False, False, False, True])
    rule = AcceptRule(max_rank=2, math_max_rank=1, math_target=True)
    assert judged(logits.clone(), torch.tensor([2, 2]), None, rule.model_copy(update={"math_target": False}),
                  math) == 2
    assert judged(logits, torch.tensor([2, 2]), None, rule, math) == 1
    assert logits.argmax(dim=1).tolist() == [2, 5]


def test_only_greedy_rows_are_judged(torch, judged):
    logits = logits_of(torch, [[(1, 2.0), (2, 1.5)], [(1, 2.0), (2, 1.5)]])
    judged(logits, torch.tensor([2, 2]), torch.tensor([True, False]), AcceptRule(max_rank=2), None)
    assert logits.argmax(dim=1).tolist() == [2, 1]


def test_the_exact_rule_configures_nothing_and_a_judged_one_travels_in_additional_config():
    assert AcceptRule().exact and AcceptRule().vllm_config() == {}
    rule = AcceptRule(max_rank=2, floor=-3.0, math_max_rank=1)
    assert rule.vllm_config() == {ADDITIONAL_KEY: {"max_rank": 2, "floor": -3.0, "math_max_rank": 1,
                                                   "math_target": False}}
    with pytest.raises(ValueError):
        AcceptRule(max_rank=0)


def test_the_pair_gives_the_rule_to_the_target_only_and_refuses_it_without_speculation():
    rule = {"max_rank": 2, "floor": -3}
    target, draft = EnginePair(target_accept=rule).engines()
    assert target.accept == AcceptRule(max_rank=2, floor=-3) and draft.accept is None
    with pytest.raises(ValueError, match="the target has none"):
        EnginePair(target_accept=rule, target_spec="none").engines()
    with pytest.raises(ValueError, match="accept judges the proposals"):
        VLLMEngineConfig(model="m", accept=rule)


def test_declared_as_a_vllm_plugin():
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("stepspec_token_accept") == "stepspec.engine.token_accept:register"


@pytest.mark.vllm
def test_register_wraps_the_rejection_sampler_once():
    from vllm.v1.sample import rejection_sampler

    from stepspec.engine import token_accept

    token_accept.register()
    wrapped = rejection_sampler.rejection_sample
    token_accept.register()  # idempotent
    assert rejection_sampler.rejection_sample is wrapped
    assert rejection_sampler.RejectionSampler._stepspec_judged
