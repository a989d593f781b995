"""lookahead, spec-thinking, <think> handling, the strategy registry and the Reasoner
API: control flow over scripted engines (real-vLLM invariants are in test_strategies)."""

import asyncio

import pytest

from stepspec.engine.protocol import EngineError
from fake_engine import ScriptedEngine
from stepspec.judges.base import JudgeError, Verdict
from strategy_runs import target_only
from stepspec.orchestrator.lookahead import GammaController
from strategy_runs import lookahead
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.run import ReasoningError, StepDelimiterError
from stepspec.orchestrator.spec_thinking import reflection_cue
from strategy_runs import spec_thinking
from strategy_runs import specreason
from stepspec.orchestrator.strategies import StrategyError, get_strategy
from scripted import DRAFT_STEPS, TARGET_STEPS, FixedJudge, Q, run, script


class RejectMatching(FixedJudge):
    """Rejects drafted steps containing ``bad``; accepts the rest."""

    def __init__(self, bad: str):
        super().__init__(True)
        self.bad = bad

    async def judge(self, candidates):
        self.seen.extend(candidates)
        return [Verdict("custom", self.bad not in c.draft_step, score=1.0) for c in candidates]


class Timeline(ScriptedEngine):
    """A scripted engine whose calls take time, logging when they start, end or are cancelled."""

    def __init__(self, name, log, delay, **kwargs):
        super().__init__(name=name, **kwargs)
        self.log, self.delay = log, delay

    async def generate(self, requests):
        self.log.append((self.name, "start", len(requests)))
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.log.append((self.name, "cancelled", len(requests)))
            raise
        results = await super().generate(requests)
        self.log.append((self.name, "end", len(requests)))
        return results


def test_lookahead_keeps_the_verified_prefix_and_the_targets_step_at_the_first_mismatch():
    judge = RejectMatching("13 - 4")
    target = script(*TARGET_STEPS)
    trace = run(lookahead(Q, draft=script(*DRAFT_STEPS), target=target, judge=judge, gamma=4))
    assert [s.author for s in trace.steps] == ["draft", "target", "draft"]
    assert trace.steps[1].text == "9 * 2 = 18." and trace.steps[1].draft_text == "13 - 4 = 9 eggs."
    # round 1: three drafted positions (the third ends the answer), one target batch of three
    assert [c.target_step for c in judge.seen[:3]] == [t.rstrip("\n") for t in TARGET_STEPS]
    assert judge.seen[1].previous_steps == ("16 - 3 = 13 eggs.",)  # conditioned on the drafted steps
    assert trace.num_generate_calls["target"] == 2
    assert trace.steps[0].num_verify_tokens > 0 and trace.answer == "18" and trace.stop_reason == "answer"
    # wasted work is counted, not hidden: the target wrote more than its kept step
    assert trace.num_generated_tokens["target"] > trace.num_target_tokens
    assert trace.num_tokens == trace.num_target_tokens + sum(s.num_draft_tokens for s in trace.steps if s.accepted)


def test_lookahead_drafts_ahead_while_the_target_verifies_and_cancels_past_a_rejection():
    log = []
    numbered = [f"Step {i}: {i} + {i} = {2 * i}.\n\n" for i in range(12)]

    def steps_of(prompt):
        return numbered[min(prompt.split("<|assistant|>")[-1].count("\n\n"), len(numbered) - 1)]

    draft = Timeline("draft", log, 0.1, continuation=steps_of)  # 3 steps ahead: 0.3 s
    target = Timeline("target", log, 0.15, continuation=steps_of)  # a batch: 0.15 s
    trace = run(lookahead(Q, draft=draft, target=target, judge=RejectMatching("Step 5"), gamma=3,
                          adaptive=False, budget=Budget(max_steps=9)))
    first_target = log.index(("target", "start", 3))
    # the draft is writing the next round while the target's first batch is in flight
    assert ("draft", "start", 1) in log[first_target + 1:log.index(("target", "end", 3))]
    # round 2 (steps 3-5) rejects step 5: the draft's round-3 work in flight is cancelled
    assert ("draft", "cancelled", 1) in log
    assert [s.author for s in trace.steps[:6]] == ["draft"] * 5 + ["target"]
    assert trace.stop_reason == "max_steps" and len(trace.steps) == 9


def test_gamma_adapts_to_the_acceptance_rate_within_bounds():
    g = GammaController(gamma=4, min_gamma=2, max_gamma=6)
    for _ in range(5):
        g.observe_round(4, 4)
    assert g.gamma == 6
    for _ in range(5):
        g.observe_round(0, 1)
    assert g.gamma == 2
    fixed = GammaController(gamma=3, adaptive=False)
    fixed.observe_round(0, 1)
    assert fixed.gamma == 3
    with pytest.raises(ValueError, match="min_gamma"):
        GammaController(gamma=1, min_gamma=2)


def test_reflection_cues():
    cues = ("wait", "alternatively", "let me check")
    assert reflection_cue("Wait, 16 - 3 is 13.", cues) == "wait"
    assert reflection_cue("**Alternatively**, count the eggs", cues) == "alternatively"
    assert reflection_cue("3. Let me check the sum.", cues) == "let me check"
    assert reflection_cue("Waiting times add up.", cues) is None  # a word, not a prefix
    assert reflection_cue("16 - 3 = 13. Wait, no.", cues) is None  # only where a step opens
    assert reflection_cue("anything", ("",)) == ""


def test_spec_thinking_hands_over_at_a_cue_and_back_after_the_stretch():
    draft = script("16 - 3 = 13 eggs.\n\n", "Wait, she bakes with 4.\n\n", "Wait, again?\n\n",
                   "x\n\n", "So \\boxed{18}.")
    target = script("t0\n\n", "She keeps 9 eggs and sells them for 9 * 2 dollars.\n\n",
                    "That is 18 dollars.\n\n", "t3\n\n", "t4 \\boxed{18}")
    trace = run(spec_thinking(Q, draft=draft, target=target, takeover_tokens=14))
    assert [s.author for s in trace.steps] == ["draft", "target", "target", "draft", "draft"]
    assert trace.steps[1].draft_text == "Wait, she bakes with 4." and trace.steps[1].judge == "cue:wait"
    assert trace.steps[2].draft_text is None  # the stretch goes on without drafting
    assert trace.num_drafted_steps == 4 and trace.num_accepted_steps == 3
    assert trace.answer == "18"


def test_think_tags_boxed_inside_thinking_does_not_end_the_trace():
    thinking = ["<think>\nFirst, 16 - 3 - 4 = 9.\n\n", "Maybe \\boxed{17}.\n\n", "No: 9 * 2 = 18.</think>\n\n"]

    def model(prompt):
        body = prompt.split("<|assistant|>")[-1]
        if "</think>" in body:
            return "The answer is \\boxed{18}."
        return thinking[min(body.count("\n\n"), 2)]

    trace = run(target_only(Q, target=ScriptedEngine(continuation=model)))
    assert [s.text for s in trace.steps] == ["<think>\nFirst, 16 - 3 - 4 = 9.", "Maybe \\boxed{17}.",
                                             "No: 9 * 2 = 18.</think>", "The answer is \\boxed{18}."]
    assert trace.answer == "18" and trace.stop_reason == "answer"
    # specreason: the draft thinks, the target writes the answer after </think>
    sr = run(specreason(Q, first_target_steps=0, draft=ScriptedEngine(continuation=model), target=ScriptedEngine(continuation=model),
                        judge=FixedJudge(True)))
    assert [s.author for s in sr.steps] == ["draft", "draft", "draft", "target"] and sr.answer == "18"


def test_a_delimiter_that_never_appears_is_an_error_that_keeps_the_trace():
    endless = ScriptedEngine(continuation=lambda p: " ".join(["word"] * 50))
    with pytest.raises(StepDelimiterError, match="never appeared") as e:
        run(target_only(Q, target=endless, budget=Budget(max_step_tokens=10, max_cut_steps=3)))
    assert len(e.value.trace.steps) == 3 and e.value.trace.stop_reason == "error"
    assert all(not s.complete for s in e.value.trace.steps)
    # allowed when asked: cut steps just continue up to the token budget
    ok = run(target_only(Q, target=endless, budget=Budget(max_step_tokens=10, max_tokens=40, max_cut_steps=None)))
    assert ok.stop_reason == "max_tokens" and len(ok.steps) == 4 and ok.num_tokens == 40


@pytest.mark.parametrize("strategy", ["specreason", "lookahead", "spec-thinking"])
def test_an_engine_dying_mid_trace_keeps_the_steps_so_far(strategy):
    calls = {"n": 0}

    def dies(prompt):
        calls["n"] += 1
        if calls["n"] > 2:
            raise EngineError("engine 'draft': vLLM engine core died")
        return DRAFT_STEPS[min(prompt.split("<|assistant|>")[-1].count("\n\n"), 2)]

    options = {"specreason": {"judge": FixedJudge(True), "first_target_steps": 0},
               "lookahead": {"judge": FixedJudge(True), "gamma": 1, "adaptive": False}, "spec-thinking": {}}[strategy]
    r = Reasoner(script(*TARGET_STEPS), ScriptedEngine(continuation=dies), strategy=strategy, **options)
    with pytest.raises(ReasoningError, match="engine core died") as e:
        r.solve(Q)
    assert e.value.trace.stop_reason == "error" and len(e.value.trace.steps) >= 1
    assert e.value.trace.steps[0].text == "16 - 3 = 13 eggs."
    r.close()


def test_registry_and_reasoner_reject_bad_configuration():
    t, d = script(*TARGET_STEPS), script(*DRAFT_STEPS)
    with pytest.raises(StrategyError, match="Did you mean 'specreason'"):
        get_strategy("spec-reason")
    with pytest.raises(JudgeError, match="unknown judge 'scor'. Did you mean 'score'"):
        Reasoner(t, d, judge="scor")
    with pytest.raises(StrategyError, match="no option 'gamma'. Its options: first_target_steps"):
        Reasoner(t, d, strategy="specreason", gamma=3)
    with pytest.raises(StrategyError, match="needs a draft engine"):
        Reasoner(t, strategy="lookahead")
    with pytest.raises(JudgeError, match="takes no judge"):
        Reasoner(t, d, strategy="spec-thinking", judge="score")
    with pytest.raises(JudgeError, match="specreason cannot use judge .embedding."):
        Reasoner(t, d, judge="embedding").solve(Q)


def test_reasoner_solves_one_and_many_problems_concurrently():
    log = []
    steps_of = {"A": ("a1\n\n", "\\boxed{1}"), "B": ("b1\n\n", "b2\n\n", "\\boxed{2}")}

    def continuation(prompt):  # the rest of the solution (a step per call: the delimiter stops it)
        key = "A" if "question A" in prompt else "B"
        steps = steps_of[key]
        return "".join(steps[min(prompt.split("<|assistant|>")[-1].count("\n\n"), len(steps) - 1):])

    target = Timeline("target", log, 0.01, continuation=continuation)
    draft = Timeline("draft", log, 0.01, continuation=continuation)
    with Reasoner(target, draft, strategy="specreason", judge=FixedJudge(True), first_target_steps=0) as r:
        one = r.solve("question A")
        assert one.answer == "1" and one.stats["num_drafted_steps"] == 2 and one.error is None
        seen, before = [], len(log)
        many = r.solve_many(["question A", "question B"] * 2, on_step=lambda i, rec: seen.append(i))
    assert [s.answer for s in many] == ["1", "2", "1", "2"]
    assert sorted(set(seen)) == [0, 1, 2, 3]
    # all four problems were in flight together: four calls began before any finished (who writes
    # each first step at a load of 4 is the goodput governor's choice)
    assert [event[1:] for event in log[before:before + 4]] == [("start", 1)] * 4

    async def inside_a_loop():
        with pytest.raises(RuntimeError, match="use `await reasoner.asolve"):
            Reasoner(target, draft, judge=FixedJudge(True)).solve("question A")
        return (await Reasoner(target, draft, judge=FixedJudge(True)).asolve("question B")).answer

    assert run(inside_a_loop()) == "2"


def test_solve_many_keeps_other_problems_when_one_fails():
    def continuation(prompt):
        if "bad" in prompt:
            raise EngineError("engine 'target': server went away")
        return "\\boxed{7}"

    engine = ScriptedEngine(continuation=continuation)
    with Reasoner(engine, strategy="target-only") as r:
        good, bad = r.solve_many(["good question", "bad question"])
        with pytest.raises(ValueError, match="question 1 is empty"):
            r.solve_many(["fine", " "])
    assert good.answer == "7" and good.error is None
    assert bad.error and "server went away" in bad.error and bad.trace.stop_reason == "error"
