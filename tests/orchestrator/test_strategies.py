"""Step-level strategies: control flow over a scripted engine, invariants on real vLLM."""


import pytest

from stepspec.engine.protocol import EngineError
from fake_engine import ScriptedEngine
from scripted import DRAFT_STEPS, Q, TARGET_STEPS, FixedJudge, run, script
from stepspec.judges.base import JudgeError, Verdict
from stepspec.judges.exact import ExactJudge
from strategy_runs import draft_only, target_only
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.driver import StrategyError
from stepspec.orchestrator.prompts import Chat
from stepspec.orchestrator.run import ReasoningError
from strategy_runs import specreason
from stepspec.orchestrator.steps import StepRules
from stepspec.orchestrator.trace import Trace


def test_baselines_cut_steps_and_stop_at_the_answer():
    trace = run(target_only(Q, target=script(*TARGET_STEPS)))
    assert [s.text for s in trace.steps] == ["16 - 3 - 4 = 9 eggs are left.", "9 * 2 = 18.",
                                             "The answer is \\boxed{18}."]
    assert trace.answer == "18" and trace.stop_reason == "answer"
    assert all(s.author == "target" for s in trace.steps) and trace.num_draft_tokens == 0
    assert trace.text == "16 - 3 - 4 = 9 eggs are left.\n\n9 * 2 = 18.\n\nThe answer is \\boxed{18}."


def test_baselines_with_run_tokens_write_their_steps_in_one_call():
    """run_tokens: one generation holds the model's steps (each a record, counted as step by
    step), up to the one with the answer (the line past it dropped)."""
    stepwise = run(target_only(Q, target=script(*TARGET_STEPS)))
    engine = ScriptedEngine(continuation=lambda p: "".join(TARGET_STEPS) + "\n\nDone.")
    trace = run(target_only(Q, target=engine, run_tokens=200))
    assert trace.text == stepwise.text and trace.answer == "18" and trace.stop_reason == "answer"
    assert [s.num_target_tokens for s in trace.steps] == [s.num_target_tokens for s in stepwise.steps]
    assert engine.num_calls == 1 and all(s.author == "target" and not s.backoff for s in trace.steps)
    with pytest.raises(StrategyError, match="strategy 'draft-only': run_tokens must be an integer >= 0, got -1"):
        run(draft_only(Q, draft=script(*DRAFT_STEPS), run_tokens=-1))


def test_specreason_keeps_accepted_drafts_and_regenerates_rejected_ones():
    class SecondStepBad(FixedJudge):
        async def judge(self, candidates):
            self.seen.extend(candidates)
            return [Verdict("custom", "13 - 4" not in c.draft_step) for c in candidates]

    judge = SecondStepBad(True)
    target = script(*TARGET_STEPS)
    trace = run(specreason(Q, first_target_steps=0, draft=script(*DRAFT_STEPS), target=target, judge=judge))
    assert [s.author for s in trace.steps] == ["draft", "target", "draft"]
    assert trace.steps[1].draft_text == "13 - 4 = 9 eggs." and trace.steps[1].accepted is False
    assert judge.seen[1].previous_steps == ("16 - 3 = 13 eggs.",)
    assert trace.num_drafted_steps == 3 and trace.num_accepted_steps == 2
    assert trace.step_acceptance_rate == pytest.approx(2 / 3)
    assert trace.answer == "18"


def test_first_steps_by_the_target_and_budgets():
    judge = FixedJudge(True)
    trace = run(specreason(Q, draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS), judge=judge,
                           first_target_steps=1, draft_opening=False))
    assert trace.steps[0].author == "target" and trace.steps[0].draft_text is None
    assert len(judge.seen) == len(trace.steps) - 1
    # draft_opening: the draft writes the first step (judged), the target the rest of its steps
    judge = FixedJudge(True)
    drafted = run(specreason(Q, draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS), judge=judge,
                             first_target_steps=2, draft_opening=True))
    assert [s.author for s in drafted.steps] == ["draft", "target", "draft"]
    assert drafted.steps[0].accepted is True and drafted.steps[1].draft_text is None and len(judge.seen) == 2
    endless = ScriptedEngine(continuation=lambda p: f"step {p.count('step')}\n\n")
    capped = run(target_only(Q, target=endless, budget=Budget(max_steps=3)))
    assert capped.stop_reason == "max_steps" and len(capped.steps) == 3 and capped.answer is None


def test_an_agents_turn_after_a_tools_result_opens_with_the_target():
    """draft_opening drafts a question's opening (and an agent's first turn), but after a tool's
    result the target writes the opening: it decides between another call and the answer."""
    asked = [{"role": "user", "content": Q}]
    answered = [*asked, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "eggs", "arguments": {"day": 1}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "16"}]
    authors = {}
    for name, messages in (("first turn", asked), ("after the result", answered)):
        trace = run(specreason(Chat(Q, messages), draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS),
                               judge=FixedJudge(True), first_target_steps=2, draft_opening=True))
        authors[name] = [s.author for s in trace.steps]
    assert authors == {"first turn": ["draft", "target", "draft"], "after the result": ["target", "target", "draft"]}


def test_a_turn_that_may_call_a_tool_opens_with_the_target():
    """With tools declared (a call rule) the target writes the opening of the first turn too: it
    decides between a call and text."""
    from stepspec.orchestrator.steps import TextCalls

    authors = {}
    tools = StepRules(calls=TextCalls(r"```json", "<tool_response>"))
    for name, rules in (("no tools", StepRules()), ("tools", tools)):
        trace = run(specreason(Q, draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS), judge=FixedJudge(True),
                               rules=rules, first_target_steps=2, draft_opening=True))
        authors[name] = [s.author for s in trace.steps]
    assert authors == {"no tools": ["draft", "target", "draft"], "tools": ["target", "target", "draft"]}


def test_repetition_guard_stops_a_loop():
    trace = run(target_only(Q, target=ScriptedEngine(continuation=lambda p: "Let me check.\n\n")))
    assert trace.stop_reason == "repetition" and len(trace.steps) == 2


def test_blank_line_inside_code_does_not_end_a_step():
    pieces = iter(["```python\nx = 16 - 3 - 4", "print(x * 2)\n```", "\\boxed{18}"])
    engine = ScriptedEngine(continuation=lambda p: next(pieces) + "\n\n")
    trace = run(target_only(Q, target=engine))
    assert trace.steps[0].text == "```python\nx = 16 - 3 - 4\n\nprint(x * 2)\n```"
    assert trace.answer == "18"


def test_bad_input_and_a_dying_engine_keep_the_trace():
    with pytest.raises(ValueError, match="question is empty"):
        run(target_only("  ", target=script(*TARGET_STEPS)))
    with pytest.raises(JudgeError, match="specreason cannot use judge 'exact'"):
        run(specreason(Q, first_target_steps=0, draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS), judge=ExactJudge()))
    calls = {"n": 0}

    def dies(prompt):
        calls["n"] += 1
        if calls["n"] > 2:
            raise EngineError("engine 'target': vLLM engine core died")
        return TARGET_STEPS[calls["n"] - 1]

    with pytest.raises(ReasoningError) as e:
        run(target_only(Q, target=ScriptedEngine(continuation=dies)))
    assert "engine core died" in str(e.value)
    assert e.value.trace.stop_reason == "error" and len(e.value.trace.steps) == 2


def test_trace_json_round_trip():
    trace = run(specreason(Q, first_target_steps=0, draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS), judge=FixedJudge(False)))
    again = Trace.from_json(trace.to_json())
    assert again == trace and again.text == trace.text


# -- invariants on real vLLM (tiny random models, different seeds, one tokenizer) -------

# The tiny models write byte soup; "ge" occurs in both models' output, so steps
# end at the delimiter or at the 8-token cap (continued by the next step).
RULES = StepRules(delimiter="ge")
BUDGET = Budget(max_steps=6, max_tokens=48, max_step_tokens=8)


def assert_one_model_wrote_it_all(rejected, accepted, t_only, d_only):
    """A judge that rejects everything gives exactly the target's text; one that
    accepts everything, the draft's; and the stats add up either way."""
    assert rejected.text == t_only.text and all(s.author == "target" for s in rejected.steps)
    assert accepted.text == d_only.text and all(s.author == "draft" for s in accepted.steps)
    for trace in (rejected, accepted):
        # trace tokens = kept drafts + target-written; accepted + rejected = drafted
        kept = sum(s.num_draft_tokens for s in trace.steps if s.accepted)
        assert trace.num_tokens == kept + trace.num_target_tokens
        rejected_steps = sum(1 for s in trace.steps if s.accepted is False)
        assert trace.num_accepted_steps + rejected_steps == trace.num_drafted_steps == len(trace.steps)
        assert set(trace.spec_decoding) == {"draft", "target"}
        # every token a model wrote is in the trace or counted as discarded work
        assert trace.num_generated_tokens["target"] >= trace.num_target_tokens
        assert trace.num_generated_tokens["draft"] >= kept
    assert rejected.num_draft_tokens > 0 and accepted.num_target_tokens == 0


@pytest.fixture(scope="module")
def baselines(tiny_pair, runner):
    """target-only and draft-only traces of Q on the tiny pair."""
    draft, target = tiny_pair
    t_only = runner.run(target_only(Q, target=target, rules=RULES, budget=BUDGET))
    d_only = runner.run(draft_only(Q, draft=draft, rules=RULES, budget=BUDGET))
    assert t_only.text != d_only.text  # two models that disagree, or the invariants prove nothing
    return t_only, d_only


@pytest.mark.vllm
def test_specreason_invariants_on_real_vllm(tiny_pair, baselines, runner):
    (draft, target), (t_only, d_only) = tiny_pair, baselines
    opts = dict(rules=RULES, budget=BUDGET)
    rejected = runner.run(specreason(Q, first_target_steps=0, draft=draft, target=target, judge=FixedJudge(False), **opts))
    accepted = runner.run(specreason(Q, first_target_steps=0, draft=draft, target=target, judge=FixedJudge(True), **opts))
    assert_one_model_wrote_it_all(rejected, accepted, t_only, d_only)


@pytest.mark.vllm
def test_lookahead_and_spec_thinking_invariants_on_real_vllm(tiny_pair, baselines, runner):
    from strategy_runs import lookahead
    from strategy_runs import spec_thinking

    (draft, target), (t_only, d_only) = tiny_pair, baselines
    opts = dict(rules=RULES, budget=BUDGET)
    for gamma in (1, 3):
        rejected = runner.run(lookahead(Q, draft=draft, target=target, judge=FixedJudge(False), gamma=gamma, **opts))
        accepted = runner.run(lookahead(Q, draft=draft, target=target, judge=FixedJudge(True), gamma=gamma, **opts))
        assert_one_model_wrote_it_all(rejected, accepted, t_only, d_only)
        # accept-all: the target verified every kept step in batches, fewer calls than steps
        assert accepted.num_generate_calls["target"] < len(accepted.steps) or gamma == 1
    # spec-thinking: a cue that never opens a step leaves the draft's text; one that
    # opens every step hands every step to the target
    never = runner.run(spec_thinking(Q, draft=draft, target=target, cues=(), **opts))
    always = runner.run(spec_thinking(Q, draft=draft, target=target, cues=("",), takeover_tokens=1, **opts))
    assert never.text == d_only.text and always.text == t_only.text


@pytest.mark.vllm
def test_likelihood_verifier_ends_are_target_only_and_draft_only_on_real_vllm(tiny_pair, baselines, runner):
    """The likelihood judge's knob, both ends: rank limit 1 (only the target's greedy
    token is plausible) writes exactly target-only's text, keeping the drafted tokens
    the target agrees with; a floor nothing falls under keeps the draft's text."""
    from stepspec.judges.likelihood import LikelihoodJudge
    from strategy_runs import lookahead

    (draft, target), (t_only, d_only) = tiny_pair, baselines
    exact = LikelihoodJudge(target, floor=None, max_rank=1, math_max_rank=None)
    loose = LikelihoodJudge(target, floor=-1e6, math_max_rank=None)
    for strategy in (specreason, lookahead):
        # specreason drafts from the first step here, so that accept-all is draft-only
        opts = dict(rules=RULES, budget=BUDGET, **({"first_target_steps": 0} if strategy is specreason else {}))
        lossless = runner.run(strategy(Q, draft=draft, target=target, judge=exact, **opts))
        assert lossless.text == t_only.text
        cuts = [s for s in lossless.steps if s.cut is not None]
        assert cuts and all(c.cut["rank"] > 1 and c.cut["rule"] == "rank" for c in cuts)
        assert all(s.num_kept_tokens == s.cut["offset"] and s.author == "target" for s in cuts)
        assert lossless.num_tokens == lossless.num_kept_draft_tokens + lossless.num_target_tokens
        everything = runner.run(strategy(Q, draft=draft, target=target, judge=loose, **opts))
        assert everything.text == d_only.text and all(s.author == "draft" for s in everything.steps)


@pytest.mark.vllm
def test_tree_on_the_likelihood_verifier_ends_is_target_only_and_draft_only_on_real_vllm(tiny_pair, baselines,
                                                                                          runner):
    """A greedy one-branch tree (k=1, beam=1) on the likelihood verifier: at rank limit 1 every
    drafted step is kept up to the target's first disagreement and repaired there, so the
    chosen branch is target-only's text (also with the target proposing the first depths,
    the default); with a floor nothing falls under and the draft proposing from the first
    depth, draft-only's."""
    from stepspec.judges.likelihood import LikelihoodJudge
    from strategy_runs import tree

    (draft, target), (t_only, d_only) = tiny_pair, baselines
    greedy = dict(rules=RULES, budget=BUDGET, k=1, beam=1, temperature=0.0, max_depth=BUDGET.max_steps)
    exact = LikelihoodJudge(target, floor=None, max_rank=1, math_max_rank=None)
    lossless = runner.run(tree(Q, draft=draft, target=target, judge=exact, first_target_steps=0, **greedy))
    assert lossless.text == t_only.text
    opened = runner.run(tree(Q, draft=draft, target=target, judge=exact, **greedy))
    assert opened.text == t_only.text and [s.author for s in opened.steps[:2]] == ["target", "target"]
    assert all(s.draft_text is None for s in opened.steps[:2])
    repaired = [s for s in lossless.steps if s.cut is not None]
    assert repaired and all(s.author == "target" and s.num_kept_tokens == s.cut["offset"] for s in repaired)
    assert lossless.search["branch_score"].startswith("plausible token share")
    everything = runner.run(tree(Q, draft=draft, target=target, judge=LikelihoodJudge(
        target, floor=-1e6, math_max_rank=None), first_target_steps=0, **greedy))
    assert everything.text == d_only.text and all(s.author == "draft" for s in everything.steps)


def test_specreason_keeps_the_plausible_prefix_of_a_cut_step_and_the_target_writes_the_rest():
    from stepspec.judges.likelihood import LikelihoodJudge

    draft = script("16 - 3 = 13 eggs.\n\n", "13 - 4 = 8 eggs.\n\n", "So she makes \\boxed{16}.")

    def target_writes(prompt: str) -> str:  # the target's own step after what is kept
        if prompt.endswith("13 - 4 ="):
            return " 9 eggs.\n\n"
        return "9 * 2 = 18, so \\boxed{18}." if prompt.endswith("\n\n") and "9 eggs" in prompt else "?\n\n"

    # the target finds " 8" implausible (it would write " 9"), everything else plausible
    target = ScriptedEngine("target", continuation=target_writes, token_scores=lambda prefix, tokens: [
        (-9.0, 4, " 9") if t == " 8" or t == "So" else (-0.2, 1, None) for t in tokens])
    trace = run(specreason(Q, first_target_steps=0, draft_after_cut=0, draft=draft, target=target,
                           judge=LikelihoodJudge(target)))
    first, cut, last = trace.steps
    assert first.author == "draft" and first.accepted and first.cut is None
    assert cut.author == "target" and cut.text == "13 - 4 = 9 eggs." and cut.draft_text == "13 - 4 = 8 eggs."
    # kept: "13", " -", " 4", " ="; the target wrote " 9", " eggs."
    assert cut.num_kept_tokens == 4 == cut.cut["offset"] and cut.cut["token"] == " 8" and cut.cut["rule"] == "floor"
    assert cut.cut["target_logprob"] == -9.0 and cut.num_target_tokens == 2
    assert cut.num_tokens == 6 and trace.num_kept_draft_tokens == 6 + 4 and trace.num_cut_steps == 2
    assert last.cut["offset"] == 0 and last.text == "9 * 2 = 18, so \\boxed{18}." and trace.answer == "18"
    # the judge scored each drafted step once, after the exact prefix the target continues
    assert [tokens for _, tokens in target.scored][1] == ["13", " -", " 4", " =", " 8", " eggs."]
    assert all(prefix.endswith(("<|assistant|>", "\n\n")) for prefix, _ in target.scored)


def test_specreason_after_a_cut_the_target_writes_its_token_and_the_draft_drafts_on():
    """draft_after_cut: the first cuts of a step cost the target one token each (the step stays
    open and the draft drafts on, judged again); past the limit the target writes the rest."""
    from stepspec.judges.likelihood import LikelihoodJudge

    def draft_writes(prompt: str) -> str:
        if prompt.endswith("= 9"):
            return " eggs and 8 left.\n\n"  # wrong again: the second cut of the step
        if prompt.endswith("and 9"):
            return " left.\n\n"
        n = prompt.split("<|assistant|>")[-1].count("\n\n")
        return ("16 - 3 = 13 eggs.\n\n", "13 - 4 = 8 eggs.\n\n", "So she makes \\boxed{18}.")[min(n, 2)]

    def target_writes(prompt: str) -> str:
        return {"13 - 4 =": " 9 eggs.\n\n", "eggs and": " 9 left.\n\n"}.get(prompt[-8:], "?\n\n")

    target = None

    def solve(**options):
        nonlocal target
        target = ScriptedEngine("target", continuation=target_writes, token_scores=lambda prefix, tokens: [
            (-9.0, 4, " 9") if t == " 8" else (-0.2, 1, None) for t in tokens])
        return run(specreason(Q, first_target_steps=0, draft=ScriptedEngine("draft", continuation=draft_writes),
                              target=target, judge=LikelihoodJudge(target), **options))

    text = "16 - 3 = 13 eggs.\n\n13 - 4 = 9 eggs and 9 left.\n\nSo she makes \\boxed{18}."
    default = solve()  # draft_after_cut=2: both cuts of step 2 cost the target a token
    assert default.text == text and default.answer == "18"
    # each token at a cut is the verification's (the target's greedy " 9"): the target writes nothing in a call
    assert target.prompts == [] and default.num_generate_calls.get("target", 0) == 0
    steps = default.steps
    assert [(s.author, s.complete, s.num_target_tokens) for s in steps] == [
        ("draft", True, 0), ("target", False, 1), ("target", False, 1), ("draft", True, 0), ("draft", True, 0)]
    assert steps[1].text == "13 - 4 = 9" and steps[1].num_kept_tokens == 4 and steps[1].cut["token"] == " 8"
    assert steps[2].text == " eggs and 9" and steps[2].num_kept_tokens == 2
    assert default.num_target_tokens == 2 and default.num_cut_steps == 2
    once = solve(draft_after_cut=1)  # the second cut of the step: the target writes the rest
    assert once.text == text and [(s.complete, s.num_target_tokens) for s in once.steps[1:3]] == [(False, 1), (True, 2)]
    assert once.steps[2].text == " eggs and 9 left."
    assert [p[-8:] for p in target.prompts] == ["eggs and"]  # the rest of the step: one call


def test_the_token_at_a_cut_comes_from_the_verification_unless_it_ends_generation():
    """TraceRun.rewrite(cap=1): the kept text and the target's greedy token at the cut, read from the
    verification without a call; a call for a token that ends generation, holds a stop string, or
    that no tokenizer can tell."""
    import asyncio

    from stepspec.judges.base import CutRule, TokenCut
    from stepspec.orchestrator.run import TraceRun

    target = ScriptedEngine("target")
    nine, end, blank = target.token_id(" 9"), target.token_id("<|end|>"), target.token_id("\n\n")

    def at_cut(token_id, special=()):
        """(the piece, whether it took a call)."""
        if special is not None:
            target.tokenizer.all_special_ids = special
        run = TraceRun(Q, "specreason", StepRules(), Budget(), {"target": target, "draft": ScriptedEngine("draft")})
        cut = TokenCut(offset=4, token=" 8", target_logprob=-9.0, draft_logprob=-0.1, rank=4, rule=CutRule.FLOOR,
                       target_token_id=token_id, kept_text="13 - 4 =")

        async def piece():
            await run.open()
            return await run.rewrite(Verdict("likelihood", accept=False, cut=cut), cap=1)

        calls = target.num_calls
        return asyncio.run(piece()), target.num_calls > calls

    piece, called = at_cut(nine)
    assert (piece.text, piece.num_tokens, piece.complete, piece.ends, called) == ("13 - 4 = 9", 1, False, None, False)
    assert at_cut(end, special=(end,))[1] and at_cut(blank)[1]
    target.tokenizer = object()  # no special ids to tell an end of turn by
    assert at_cut(nine, special=None)[1]


def test_specreason_keeps_a_step_the_draft_wrote_confidently_without_the_targets_check():
    """confident_logprob: a drafted step whose every token the draft wrote with at least that
    logprob joins the trace unchecked; a less sure one is verified as before."""
    from stepspec.judges.likelihood import LikelihoodJudge

    def solve(logprob, **options):
        draft = script(*DRAFT_STEPS)
        draft._token_logprob = lambda text: logprob
        target = ScriptedEngine("target")
        trace = run(specreason(Q, first_target_steps=0, draft=draft, target=target, judge=LikelihoodJudge(target),
                               **options))
        return trace, target

    sure, target = solve(-0.1, confident_logprob=-0.5)
    assert sure.answer == "18" and target.scored == [] and all(s.author == "draft" for s in sure.steps)
    assert {s.judge for s in sure.steps} == {"confident"} and sure.num_judge_calls == 0
    assert all(s.accepted and s.draft_text == s.text for s in sure.steps)  # drafted, kept as drafted
    unsure, target = solve(-0.9, confident_logprob=-0.5)
    assert unsure.answer == "18" and len(target.scored) == len(unsure.steps)
    assert {s.judge for s in unsure.steps} == {"likelihood"}
    checked, target = solve(-0.1)  # off by default: every drafted step is checked
    assert len(target.scored) == len(checked.steps)


def test_goodput_governor_drafts_alone_and_backs_off_when_target_steps_are_cheaper_under_load():
    from stepspec.orchestrator.goodput import GoodputGovernor
    from stepspec.orchestrator.trace import Author

    g = GoodputGovernor(min_samples=2, explore_every=5)
    g.enter()
    assert all(g.decide() is Author.DRAFT for _ in range(10))  # alone: always draft
    for _ in range(7):
        g.enter()  # 8 in flight: bucket 8
    assert g.bucket(g.in_flight) == 8
    assert [g.decide(), g.decide(), g.decide()] == [Author.TARGET] * 3  # explore: the target (the baseline) first
    g.observe(Author.TARGET, 8, 10, 1.0)
    g.observe(Author.TARGET, 8, 10, 1.0)
    assert [g.decide(), g.decide()] == [Author.DRAFT] * 2  # then drafting, all of it, until it has its samples
    g.observe(Author.DRAFT, 8, 10, 4.0)
    g.observe(Author.DRAFT, 8, 10, 4.0)
    decisions = [g.decide() for _ in range(4)]  # decisions 6-9 of the bucket: the 10th explores
    assert decisions == [Author.TARGET] * 4
    # the 10th decision re-measures drafting, which writes until it has 2 more samples
    assert [g.decide(), g.decide()] == [Author.DRAFT] * 2
    g.observe(Author.DRAFT, 8, 10, 4.0)
    assert g.decide() is Author.DRAFT
    g.observe(Author.DRAFT, 8, 10, 4.0)
    assert g.decide() is Author.TARGET
    assert g.snapshot()["buckets"]["8"] == {
        "draft": {"seconds_per_token": pytest.approx(0.4), "samples": 4, "spoiled": 0},
        "target": {"seconds_per_token": pytest.approx(0.1), "samples": 2, "spoiled": 0}, "decisions": 13}
    for _ in range(7):
        g.exit()
    assert g.decide() is Author.DRAFT  # the load fell: draft again


def test_goodput_governor_bounds_exploration_carries_verdicts_and_restores():
    """A mode whose steps never run pure (a wave's tail) is explored until ``max_spoiled`` of
    its steps ended impure (drafting's: or are in flight), then the target, the baseline,
    writes; a verdict carries to the loads it implies; a governor restored from a snapshot
    decides as the one that took it."""
    from stepspec.orchestrator.goodput import GoodputGovernor
    from stepspec.orchestrator.trace import Author

    g = GoodputGovernor(min_samples=2, max_spoiled=5, explore_every=50)
    for _ in range(3):
        g.enter()  # bucket 2
    target = [g.begin(g.decide()) for _ in range(2)]
    assert {t.mode for t in target} == {Author.TARGET}  # the target first
    for t in target:
        g.end(t, 10)  # pure: measured
    drafted = [g.begin(g.decide()) for _ in range(2)]
    assert {t.mode for t in drafted} == {Author.DRAFT}  # then drafting
    for _ in range(3):
        beside = g.begin(Author.TARGET, measured=True)  # a step of the other mode beside each: spoiled
        t = g.begin(g.decide())
        assert t.mode is Author.DRAFT
        g.end(beside, 10)
        g.end(t, 10)
    for t in drafted:
        g.end(t, 10)
    assert g.buckets[2].num_spoiled == {Author.TARGET: 3, Author.DRAFT: 5}
    assert g.buckets[2].num_samples == {Author.TARGET: 2, Author.DRAFT: 0}
    # drafting spoiled max_spoiled times, unmeasured: the target writes; the 50th decision re-explores
    decisions = [g.decide() for _ in range(50 - g.buckets[2].num_decisions)]
    assert set(decisions[:-1]) == {Author.TARGET} and decisions[-1] is Author.DRAFT
    # drafting measured dearer at 4-7 in flight: at 8 and beyond the target writes without exploring
    for _ in range(2):
        g.observe(Author.TARGET, 4, 10, 1.0)
        g.observe(Author.DRAFT, 4, 10, 3.0)
    for _ in range(9):
        g.enter()  # 12 in flight: bucket 8
    assert {g.decide() for _ in range(20)} == {Author.TARGET} and g.buckets[8].num_samples[Author.TARGET] == 0
    # drafting measured cheaper at 16-31: as near as 4-7, so the lower load's verdict holds
    for _ in range(2):
        g.observe(Author.TARGET, 16, 10, 3.0)
        g.observe(Author.DRAFT, 16, 10, 1.0)
    assert g.decide() is Author.TARGET
    g.buckets.pop(4)  # without it, drafting wins at 8-15 too, without exploring there
    g.buckets.pop(8)
    assert {g.decide() for _ in range(5)} == {Author.DRAFT}
    again = GoodputGovernor.restore(g.snapshot(), min_samples=2, max_spoiled=5, explore_every=50)
    assert again.snapshot() == g.snapshot() and again.in_flight == 0
    for _ in range(12):
        again.enter()
    assert {again.decide() for _ in range(5)} == {Author.DRAFT}


def test_goodput_governor_measures_only_steps_no_step_of_the_other_mode_ran_beside():
    """The engines share the machine: a target step slowed by drafted steps beside it (and
    the reverse) is not a rate of its mode. The target's openings are no samples and belong
    to neither mode (they run in both regimes). A wave of 25: openings, then target steps
    (pure), then drafted steps, measured once the last target step has ended."""
    from stepspec.orchestrator.goodput import GoodputGovernor
    from stepspec.orchestrator.trace import Author

    now = [0.0]
    # max_spoiled above the load: the whole wave may draft at once (see the next test for the bound)
    g = GoodputGovernor(min_samples=3, max_spoiled=50, explore_every=100, clock=lambda: now[0])
    for _ in range(25):
        g.enter()
    openings = [g.begin(Author.TARGET, measured=False) for _ in range(25)]  # as a policy forces them
    now[0] = 2.0
    for t in openings[:24]:
        g.end(t, 20)
    assert g.buckets == {}  # openings: no samples
    first = [g.begin(g.decide()) for _ in range(24)]
    assert {t.mode for t in first} == {Author.TARGET}  # the target is unmeasured: explored first
    now[0] = 4.0
    for t in first[:3]:  # beside the last opening: measured all the same, 0.1 s a token
        g.end(t, 20)
    assert g.buckets[16].seconds_per_token[Author.TARGET] == pytest.approx(0.1)
    drafted = [g.begin(g.decide()) for _ in range(3)]  # measured: now the whole wave drafts
    assert {t.mode for t in drafted} == {Author.DRAFT}
    now[0] = 5.0
    g.end(openings[24], 30)
    for t in first[3:] + drafted:  # each ran beside steps of the other mode: not measured
        g.end(t, 10)
    assert g.buckets[16].num_samples == {Author.TARGET: 3, Author.DRAFT: 0}
    pure = [g.begin(g.decide()) for _ in range(25)]
    assert {t.mode for t in pure} == {Author.DRAFT}
    now[0] = 8.0
    for t in pure[:3]:
        g.end(t, 20)  # 0.15 s a token, every trace drafting: measured
    assert g.buckets[16].seconds_per_token[Author.DRAFT] == pytest.approx(0.15)
    assert g.decide() is Author.TARGET  # both measured: 0.1 s a token against 0.15, the target wins
    # a target step begun beside the 22 drafted steps still running is not measured, nor are they
    beside = g.begin(Author.TARGET)
    now[0] = 9.0
    g.end(beside, 1)
    for t in pure[3:]:
        g.end(t, 20)
    assert g.buckets[16].num_samples == {Author.TARGET: 3, Author.DRAFT: 3}
    assert g.num_running == {Author.DRAFT: 0, Author.TARGET: 0, None: 0}


def test_goodput_governor_counts_drafted_steps_in_flight_against_exploration():
    """Exploring drafting spends drafted steps: those in flight count against ``max_spoiled``,
    so with 25 in flight 8 begin, not one per trace before the first has ended (none of them
    runs pure beside the target's steps); the target's exploration costs nothing against the
    baseline and is bounded by its ended steps only."""
    from stepspec.orchestrator.goodput import GoodputGovernor
    from stepspec.orchestrator.trace import Author

    g = GoodputGovernor(min_samples=2, max_spoiled=8, explore_every=1000)
    for _ in range(25):
        g.enter()
    target = [g.begin(g.decide()) for _ in range(25)]
    assert {t.mode for t in target} == {Author.TARGET}  # a whole regime: its steps in flight do not bound it
    for t in target[:10]:
        g.end(t, 10)  # pure: measured
    wave = [g.begin(g.decide()) for _ in range(10)]  # the next steps of those 10 traces
    assert [t.mode for t in wave] == [Author.DRAFT] * 8 + [Author.TARGET] * 2
    assert g.buckets[16].num_running == {Author.DRAFT: 8, Author.TARGET: 17}
    for t in target[10:] + wave:
        g.end(t, 10)  # every one ran beside the other mode's steps: no samples
    rates = g.buckets[16]
    assert rates.num_spoiled[Author.DRAFT] == 8 and rates.num_running == {Author.DRAFT: 0, Author.TARGET: 0}
    assert {g.decide() for _ in range(20)} == {Author.TARGET}  # drafting, unmeasured, explored out: the target


def test_a_drafted_opening_is_the_governors_choice_but_no_sample():
    """The first step carries the question's prefill: its seconds per token are not its mode's."""
    from stepspec.orchestrator.goodput import GoodputGovernor
    from stepspec.orchestrator.trace import Author

    for draft_opening in (False, True):  # drafting from the first step, or the opening drafted
        g = GoodputGovernor()
        trace = run(specreason(Q, first_target_steps=int(draft_opening), draft_opening=draft_opening,
                               draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS), judge=FixedJudge(True),
                               governor=g))
        assert [s.author for s in trace.steps] == ["draft"] * 3
        assert g.buckets[1].num_samples[Author.DRAFT] == 2  # the second and third steps


@pytest.mark.parametrize("strategy", ["specreason", "arbitrage"])
def test_drafting_strategies_back_off_under_load_and_record_it(strategy):
    """Many problems in flight, target steps measured cheaper per token: the target writes."""
    from stepspec.orchestrator.goodput import GoodputGovernor
    from stepspec.orchestrator.trace import Author
    from stepspec.orchestrator.reasoner import Reasoner
    from stepspec.routers.threshold import ThresholdRouter

    draft, target = script(*DRAFT_STEPS), script(*TARGET_STEPS)
    draft.delay = target.delay = 0.001  # each call yields: the problems are in flight together
    # the judge and the router keep every drafted step
    chooser = {"judge": FixedJudge(True)} if strategy == "specreason" else {"router": ThresholdRouter(min_confidence=0)}
    reasoner = Reasoner(target, draft, strategy=strategy, max_concurrency=8, first_target_steps=0, **chooser)
    assert isinstance(reasoner.governor, GoodputGovernor)
    for b in (4, 8):  # measured earlier at this load: drafting costs 10x more per token
        for _ in range(reasoner.governor.min_samples):
            reasoner.governor.observe(Author.DRAFT, b, 10, 10.0)
            reasoner.governor.observe(Author.TARGET, b, 10, 1.0)
    solutions = reasoner.solve_many([Q] * 8)
    steps = [s for sol in solutions for s in sol.trace.steps]
    backed_off = [s for s in steps if s.backoff]
    assert backed_off and all(s.author == "target" and s.draft_text is None for s in backed_off)
    assert sum(sol.stats["num_backoff_steps"] for sol in solutions) == len(backed_off)
    # alone, the same reasoner drafts every step
    alone = reasoner.solve(Q)
    assert alone.stats["num_backoff_steps"] == 0 and all(s.author == "draft" for s in alone.trace.steps)
    reasoner.close()


def test_problems_given_together_are_in_flight_from_their_first_decision():
    """solve_many's problems start together: the first one's first step is decided at their
    load, not alone (where the draft always drafts) before the others have entered."""
    from stepspec.orchestrator.reasoner import Reasoner
    from stepspec.orchestrator.trace import Author

    draft, target = script(*DRAFT_STEPS), script(*TARGET_STEPS)
    draft.delay = target.delay = 0.001  # each call yields: the problems are in flight together
    reasoner = Reasoner(target, draft, strategy="specreason", max_concurrency=8, first_target_steps=0,
                        judge=FixedJudge(True))
    for _ in range(reasoner.governor.min_samples):  # measured at 8 in flight: drafting costs 10x more per token
        reasoner.governor.observe(Author.DRAFT, 8, 10, 10.0)
        reasoner.governor.observe(Author.TARGET, 8, 10, 1.0)
    solutions = reasoner.solve_many([Q] * 8)
    assert [[s.author for s in sol.trace.steps if not s.backoff] for sol in solutions] == [[]] * 8
    assert reasoner.governor.num_decisions[Author.DRAFT] == 0
    reasoner.close()


def test_backing_off_with_backoff_tokens_the_target_writes_its_steps_in_one_call():
    """backoff_tokens: where drafting does not pay, one generation holds the target's next
    steps (each a record of its own, counted), up to the one that ends the trace."""
    from stepspec.orchestrator.goodput import GoodputGovernor
    from stepspec.orchestrator.trace import Author

    def loaded():
        g = GoodputGovernor()
        for _ in range(7):
            g.enter()  # with this problem, 8 in flight
        for _ in range(g.min_samples):  # measured: a drafted step costs 10x more per token
            g.observe(Author.DRAFT, 8, 10, 10.0)
            g.observe(Author.TARGET, 8, 10, 1.0)
        return g

    def rest(prompt: str) -> str:  # the target's steps from where the prompt stands, and a line past its answer
        n = prompt.split("<|assistant|>")[-1].count("\n\n")
        return "".join(TARGET_STEPS[n:]) + "\n\nDone."

    stepwise, target = run(specreason(Q, draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS),
                                      judge=FixedJudge(True), first_target_steps=0, backoff_tokens=0,
                                      governor=loaded())), \
        ScriptedEngine(continuation=rest)
    at_once = run(specreason(Q, draft=script(*DRAFT_STEPS), target=target, judge=FixedJudge(True),
                             first_target_steps=0, backoff_tokens=200, governor=loaded()))
    assert at_once.text == stepwise.text == "\n\n".join(s.strip() for s in TARGET_STEPS)
    assert [(s.author, s.backoff) for s in at_once.steps] == [("target", True)] * 3
    assert target.num_calls == 1 and at_once.answer == "18" and at_once.stop_reason == "answer"
    assert [s.num_target_tokens for s in at_once.steps] == [s.num_target_tokens for s in stepwise.steps]
    assert at_once.num_backoff_steps == 3


def test_under_load_the_default_specreason_is_target_only_in_one_generation():
    """The defaults (backoff_tokens 640, the drafted opening): where the governor gives a trace's
    first step to the target, the target writes the whole trace in one call, as target-only
    writes alone; the draft writes nothing. Alone, it drafts."""
    from stepspec.orchestrator.goodput import GoodputGovernor

    def rest(prompt: str) -> str:
        n = prompt.split("<|assistant|>")[-1].count("\n\n")
        return "".join(TARGET_STEPS[n:])

    loaded = GoodputGovernor()
    for _ in range(7):
        loaded.enter()  # with this problem, 8 in flight: nothing measured, the target explores first
    target, draft = ScriptedEngine(continuation=rest), script(*DRAFT_STEPS)
    trace = run(specreason(Q, draft=draft, target=target, judge=FixedJudge(True), governor=loaded))
    assert trace.text == "\n\n".join(s.strip() for s in TARGET_STEPS) and trace.answer == "18"
    assert target.num_calls == 1 and draft.num_calls == 0 and trace.num_backoff_steps == 3
    alone = run(specreason(Q, draft=script(*DRAFT_STEPS), target=ScriptedEngine(continuation=rest),
                           judge=FixedJudge(True), governor=GoodputGovernor()))
    assert alone.num_backoff_steps == 0 and alone.steps[0].author == "draft"


def test_a_reasoner_starts_only_the_engines_its_strategy_uses():
    from stepspec.orchestrator.reasoner import Reasoner

    for strategy, used in (("draft-only", ["draft"]), ("target-only", ["target"]),
                           ("specreason", ["target", "draft"])):
        target, draft = script(*TARGET_STEPS), script(*TARGET_STEPS)
        heard = []
        with Reasoner(target, draft, strategy=strategy) as reasoner:
            reasoner.load(on_engine=lambda role, engine, started: heard.append((role, started)))
            assert reasoner.solve(Q).trace.answer == "18"
        assert [r for r, started in heard if not started] == used
        assert heard == [(r, s) for r in used for s in (False, True)]  # each start heard begin and end
        assert (target.started, draft.started) == ("target" in used, "draft" in used), strategy
