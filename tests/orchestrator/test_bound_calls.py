"""Calls bound to their schemas (``StepRules.constraint``): a step's generation carries the
constraint until a call opens in it, never inside one, and a token-level cut in a drafted step
that holds a call has the target write the step again, the call bound from its opening, instead
of going on free from the cut. Scripted engines; the constraint's grammar itself is tested with the tool
declarations (tests/workflows/test_toolcalls.py) and on vLLM (tests/engine)."""

import asyncio

import pytest

from fake_engine import ScriptedEngine
from stepspec.engine.types import Structured
from stepspec.judges.base import CutRule, TokenCut, Verdict
from stepspec.orchestrator.steps import StepRules, TextCalls, constraint_after
from stepspec.orchestrator.strategies import STRATEGIES

BOUND = Structured(json='{"type": "object"}')
RULES = StepRules(calls=TextCalls(r"```json", "<tool_response>", constraint=BOUND))
CALL = 'Calling.\n```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```'


def test_a_generation_is_bound_until_a_call_opens():
    assert constraint_after(RULES, "") is BOUND
    assert constraint_after(RULES, "I add first.") is BOUND
    assert constraint_after(RULES, 'Calling.\n```json\n{"name": "add", ') is None  # inside a call: free
    assert constraint_after(StepRules(), "") is None


class CutAt:
    """Cuts a drafted step where ``at`` begins (a token-level verifier's partial rejection)."""

    def __init__(self, at: str) -> None:
        self.at = at

    name = "cut"
    needs_target_step = needs_draft_tokens = False
    draft_top_k = 0

    async def judge(self, candidates):
        out = []
        for c in candidates:
            at = c.draft_step.find(self.at)
            cut = TokenCut(offset=5, token=self.at, target_logprob=-9.0, draft_logprob=-0.1, rank=7,
                           rule=CutRule.FLOOR, target_token_id=-1, kept_text=c.draft_step[:at]) if at >= 0 else None
            out.append(Verdict(self.name, cut is None, cut=cut))
        return out


@pytest.mark.parametrize("cut_at", ['"b"', "```json"])  # inside the call; at its opening
def test_a_cut_in_a_drafted_call_has_the_target_write_the_call_again_bound(cut_at):
    draft = ScriptedEngine("draft", continuation=lambda prompt: CALL)
    target = ScriptedEngine("target", continuation=lambda prompt: CALL)
    trace = asyncio.run(STRATEGIES["specreason"].run("Add 1 and 2.", target=target, draft=draft,
                                                     judge=CutAt(cut_at), rules=RULES, first_target_steps=0,
                                                     draft_opening=True, backoff=False))
    assert [s.structured for s in draft.samplings] == [BOUND]
    # the target writes the step from where the draft began it (no kept drafted head), bound again
    assert target.prompts == draft.prompts and [s.structured for s in target.samplings] == [BOUND]
    (step,) = trace.steps
    assert step.author == "target" and step.text == CALL and step.cut is None
