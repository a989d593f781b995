"""Tree search, best-of-n and the judge queue: bookkeeping on scripted engines, and the
search on tiny real models through vLLM."""

import asyncio
import re

import pytest

from stepspec.engine.types import Completion, FinishReason, GenerationResult
from fake_engine import ScriptedEngine
from stepspec.judges.base import CutRule, StepCandidate, TokenCut, Verdict
from strategy_runs import best_of_n, best_of_n_target
from stepspec.orchestrator.driver import StrategyError
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.steps import answer_key
from stepspec.orchestrator.trace import Trace
from stepspec.orchestrator.tree import load_tree
from strategy_runs import tree, tree_target
from stepspec.orchestrator.verify_queue import JudgeQueue

Q = "What is 3 + 4?"


class Sampler(ScriptedEngine):
    """Writes ``choose(prompt, seed)``: sampled siblings differ by their seeds."""

    def __init__(self, name, choose):
        super().__init__(name)
        self.choose = choose
        self.batches: list[int] = []

    async def generate(self, requests):
        self.batches.append(len(requests))
        out = []
        for r in requests:
            self.prompts.append(str(r.prompt))
            text = self.choose(str(r.prompt), r.sampling.seed)
            reason, stop_string = FinishReason.EOS, None
            hits = [(text.index(s), s) for s in r.sampling.stop if s in text]
            if hits:
                at, stop_string = min(hits)
                text, reason = text[:at], FinishReason.STOP
            ids = tuple(range(len(text.split())))
            out.append(GenerationResult((Completion(text, ids, reason, stop_string),), 1))
        return out


class TextScore:
    """A judge scoring a candidate by a "[s=N]" tag in its text (0 without one); accepts at 5."""

    name, needs_target_step, needs_draft_tokens, draft_top_k = "tag", False, False, 0

    def __init__(self):
        self.calls: list[int] = []

    async def judge(self, candidates):
        self.calls.append(len(candidates))
        out = []
        for c in candidates:
            m = re.search(r"\[s=(\d+)\]", c.draft_step)
            s = float(m.group(1)) if m else 0.0
            out.append(Verdict(self.name, s >= 5, score=s, num_judge_calls=1))
        return out


def depth_of(prompt: str) -> int:
    return prompt.split("<|assistant|>")[-1].count("\n\n")


def test_beam_keeps_b_branches_per_depth_and_the_best_answer_wins():
    # depth 1: three candidates scored 9, 7, 3; depth 2: each branch's samples end the
    # trace with an answer scored by the seed
    def choose(prompt, seed):
        if depth_of(prompt) == 0:
            return ["a [s=9]\n\n", "b [s=7]\n\n", "c [s=3]\n\n"][seed % 3]
        branch = "a" if "a [s=9]" in prompt else "b"
        answer = {"a": [("\\boxed{1} [s=2]"), ("\\boxed{2} [s=6]")], "b": [("\\boxed{3} [s=9]"), ("\\boxed{4} [s=8]")]}
        return answer[branch][seed % 2]

    draft, target, judge = Sampler("draft", choose), Sampler("target", choose), TextScore()
    trace = asyncio.run(tree(Q, draft=draft, target=target, judge=judge, k=3, beam=2, max_depth=4,
                             first_target_steps=0))
    g = load_tree(trace)
    depth1 = [n for n in g.nodes if g.nodes[n]["depth"] == 1]
    assert sorted(g.nodes[n]["score"] for n in depth1) == [3, 7, 9]
    assert sorted(g.nodes[n]["score"] for n in depth1 if g.nodes[n]["beam"]) == [7, 9]  # b = 2 survive
    assert all(g.out_degree(n) == 0 for n in depth1 if not g.nodes[n]["beam"])  # the pruned one stops
    # paths: a(9)->2(6): 7.5, b(7)->3(9): 8.0, b->4(8): 7.5: the best mean score wins; a->1 (scored
    # 2, rejected) stays in the picture, not in the search
    assert trace.answer == "3" and [s.text for s in trace.steps] == ["b [s=7]", "\\boxed{3} [s=9]"]
    assert [g.nodes[n]["text"] for n in g.nodes if g.nodes[n].get("chosen")] == ["b [s=7]", "\\boxed{3} [s=9]"]
    assert trace.search["num_finished"] == 3 and trace.stop_reason == "answer"
    assert [g.nodes[n]["accepted"] for n in g.nodes if g.nodes[n].get("text") == "\\boxed{1} [s=2]"] == [False]
    # one batched proposal call and one judge batch per depth, candidates of both branches together
    assert draft.batches[:2] == [3, 6] and judge.calls == [3, 6] and target.batches == []


def test_the_answer_most_finished_branches_reach_wins_over_the_best_scored_one():
    # depth 1: a (9), b (8), c (7), all three go on; depth 2: a answers 1, b and c 2,000.0
    def choose(prompt, seed):
        if depth_of(prompt) == 0:
            return ["a [s=9]\n\n", "b [s=8]\n\n", "c [s=7]\n\n"][seed % 3]
        return "so \\boxed{1} [s=9]" if "a [s=9]" in prompt else "so \\boxed{2,000.0} [s=6]"

    def run(**vote):
        return asyncio.run(tree(Q, draft=Sampler("draft", choose), target=Sampler("target", choose), judge=TextScore(),
                                k=3, beam=3, max_depth=3, first_target_steps=0, **vote))

    voted = run()
    # paths: a->1 scores 9, b->2 7, c->2 6.5: "2000" has two votes (numbers compared as numbers);
    # of its branches the better-scored one, b, is kept
    assert voted.answer == "2,000.0" and [s.text for s in voted.steps] == ["b [s=8]", "so \\boxed{2,000.0} [s=6]"]
    assert voted.search["votes"] == {"1": 1, "2000": 2} and voted.search["options"]["vote"] == "majority"
    best = run(vote="best")
    assert best.answer == "1" and best.search["votes"] == {"1": 1, "2000": 2}
    with pytest.raises(StrategyError, match="strategy 'tree': vote must be"):
        run(vote="weighted")


def test_target_writes_only_where_every_candidate_is_poor():
    def choose(prompt, seed):
        return "poor [s=1]\n\n" if depth_of(prompt) == 0 else "\\boxed{5} [s=6]"

    target = Sampler("target", lambda p, s: "target step [s=8]\n\n")
    trace = asyncio.run(tree(Q, draft=Sampler("draft", choose), target=target, judge=TextScore(), k=3, beam=2,
                             max_depth=3, first_target_steps=0))
    assert trace.steps[0].author == "target" and trace.steps[0].text == "target step [s=8]"
    assert trace.steps[1].author == "draft" and trace.answer == "5"
    assert target.batches == [1]  # one branch, one regenerated step


class WordVerifier(TextScore):
    """A token-level verifier over words (the Sampler's tokens): the first word "BAD" is the cut;
    "[p=N]" sets the share of plausible words of a step it accepts."""

    name, needs_target_step, needs_draft_tokens, draft_top_k = "words", False, True, 0

    async def judge(self, candidates):
        self.calls.append(len(candidates))
        out = []
        for c in candidates:
            assert c.prefix is not None and len(c.draft_token_ids) == len(c.draft_step.split())
            words = c.draft_step.split()
            if "BAD" in words:
                at = words.index("BAD")
                cut = TokenCut(at, "BAD", -9.0, -0.1, 7, CutRule.FLOOR, 0, " ".join(words[:at]) + " ")
                out.append(Verdict(self.name, False, score=-9.0, cut=cut, plausible=1 - 1 / len(words)))
            else:
                m = re.search(r"\[p=([\d.]+)\]", c.draft_step)
                out.append(Verdict(self.name, True, score=-1.0, plausible=float(m.group(1)) if m else 1.0))
        return out


def test_with_a_token_level_verifier_the_target_repairs_a_branch_at_its_latest_cut():
    def choose(prompt, seed):
        if depth_of(prompt) == 0:  # three drafted openings, every one cut: at words 1, 3 and 2
            return ["x BAD y z\n\n", "a b c BAD e\n\n", "p q BAD r\n\n"][seed % 3]
        return "so \\boxed{7}"

    target = Sampler("target", lambda p, s: "d e.\n\n" if p.endswith("a b c ") else "?")
    trace = asyncio.run(tree(Q, draft=Sampler("draft", choose), target=target, judge=WordVerifier(), k=3,
                             beam=2, first_target_steps=0))
    first = trace.steps[0]
    assert first.author == "target" and first.text == "a b c d e." and first.num_kept_tokens == 3
    assert first.cut["token"] == "BAD" and first.draft_text == "a b c BAD e" and first.accepted is False
    assert trace.steps[1].author == "draft" and trace.answer == "7" and target.batches == [1]
    g = load_tree(trace)
    repaired = [g.nodes[n] for n in g.nodes if g.nodes[n].get("repaired")]
    assert len(repaired) == 1 and repaired[0]["plausible"] == 1.0 and repaired[0]["author"] == "target"
    # the three cut proposals stay in the picture, pruned
    cut = [n for n in g.nodes if g.nodes[n].get("accepted") is False and not g.nodes[n].get("repaired")]
    assert len(cut) == 3 and all(g.out_degree(n) == 0 for n in cut)
    assert trace.search["branch_score"].startswith("plausible token share")
    # the terminal picture says what each node's score is
    from rich.console import Console

    from stepspec.workflows.cli.tree_view import rich_tree

    console = Console(record=True, width=150)
    console.print(rich_tree(trace))
    shown = console.export_text()
    assert "target 100% plausible, cut 'BAD' -9.0, repaired  a b c d e." in shown
    assert "draft 75% plausible, cut 'BAD' -9.0  x BAD y z" in shown


def test_with_a_token_level_verifier_cut_candidates_are_dropped_when_a_sibling_passes_even_those_that_end_the_trace():
    def choose(prompt, seed):
        if depth_of(prompt) == 0:  # accepted; cut, open; cut, ends the trace; cut, ends the trace
            return ["a b\n\n", "c BAD d\n\n", "so BAD \\boxed{3}", "thus BAD \\boxed{4}"][seed % 4]
        return "\\boxed{5}"

    target = Sampler("target", lambda p, s: "\\boxed{7}")
    trace = asyncio.run(tree(Q, draft=Sampler("draft", choose), target=target, judge=WordVerifier(), k=4,
                             beam=2, first_target_steps=0))
    assert target.batches == []  # no repair: the target only verified
    assert trace.search["votes"] == {"5": 1} and trace.search["num_finished"] == 1
    assert trace.answer == "5" and [s.author for s in trace.steps] == ["draft", "draft"]
    g = load_tree(trace)
    assert not any(g.nodes[n].get("repaired") for n in g.nodes)
    dropped = [n for n in g.nodes if "BAD" in g.nodes[n]["text"]]
    assert len(dropped) == 3 and all(g.out_degree(n) == 0 for n in dropped)


def test_with_a_token_level_verifier_the_beam_ranks_by_the_share_of_plausible_tokens():
    def choose(prompt, seed):
        if depth_of(prompt) == 0:
            return ["low [p=0.5]\n\n", "high [p=0.9]\n\n", "mid [p=0.7]\n\n"][seed % 3]
        return "\\boxed{1} [p=0.6]" if "low" in prompt else "\\boxed{2} [p=0.8]"

    trace = asyncio.run(tree(Q, draft=Sampler("draft", choose), target=Sampler("t", lambda p, s: "?"),
                             judge=WordVerifier(), k=3, beam=2, first_target_steps=0))
    g = load_tree(trace)
    assert sorted(g.nodes[n]["text"] for n in g.nodes if g.nodes[n].get("beam")) == ["high [p=0.9]", "mid [p=0.7]"]
    # shares count tokens, not steps: "high [p=0.9]" (2 words, 0.9) then "\boxed{2} [p=0.8]" (2 words, 0.8)
    assert trace.answer == "2" and trace.steps[0].text == "high [p=0.9]"


def test_tree_target_is_the_same_search_with_the_target_proposing():
    def choose(prompt, seed):
        return f"t{seed % 2} [s=6]\n\n" if depth_of(prompt) == 0 else "\\boxed{9} [s=8]"

    target = Sampler("target", choose)
    trace = asyncio.run(tree_target(Q, target=target, judge=TextScore(), k=2, beam=2))
    assert trace.strategy == "tree-target" and trace.answer == "9"
    assert all(s.author == "target" for s in trace.steps) and target.batches[:2] == [2, 4]


def test_the_target_proposes_the_first_depths_as_in_tree_target_and_the_draft_the_rest():
    def choose(who):
        def write(prompt, seed):
            depth = depth_of(prompt)
            return f"{who}{depth}.{seed % 3} [s={5 + seed % 3}]\n\n" if depth < 3 else f"\\boxed{{{who}}} [s=9]"
        return write

    draft, target = Sampler("draft", choose("d")), Sampler("target", choose("t"))
    trace = asyncio.run(tree(Q, draft=draft, target=target, judge=TextScore(), k=3, beam=2))
    twin = asyncio.run(tree_target(Q, target=Sampler("target", choose("t")), judge=TextScore(), k=3, beam=2))
    assert trace.search["options"]["first_target_steps"] == 2  # the default: the opening and the plan
    # depths 1 and 2: the target proposes (3, then 3 per beam branch), the same nodes as its twin's
    assert target.batches == [3, 6] and draft.batches[0] == 6
    g, h = load_tree(trace), load_tree(twin)

    def nodes(graph, depths):
        return sorted((d["depth"], d["text"], d["author"], d["score"], d["beam"]) for _, d in graph.nodes(data=True)
                      if d["depth"] in depths)

    assert nodes(g, (1, 2)) == nodes(h, (1, 2)) and {a for _, _, a, _, _ in nodes(g, (1, 2))} == {"target"}
    assert {a for _, _, a, _, _ in nodes(g, (3, 4))} == {"draft"}
    assert [s.author for s in trace.steps] == ["target", "target", "draft", "draft"] and trace.answer == "d"
    # the target's opening was rated, but no draft was judged there: step acceptance counts the drafted two
    assert [s.accepted for s in trace.steps] == [None, None, True, True]
    assert (trace.num_drafted_steps, trace.num_accepted_steps, trace.step_acceptance_rate) == (2, 2, 1.0)
    # the twin takes no opening option: it proposes at every depth
    with pytest.raises(StrategyError, match="'tree-target' has no option 'first_target_steps'"):
        asyncio.run(tree_target(Q, target=Sampler("target", choose("t")), judge=TextScore(), first_target_steps=1))


def test_budgets_stop_the_search():
    endless = Sampler("draft", lambda p, s: f"more {s} [s=6]\n\n")
    trace = asyncio.run(tree(Q, draft=endless, target=endless, judge=TextScore(), k=2, beam=2, max_depth=3))
    assert trace.stop_reason == "max_depth" and len(trace.steps) == 3 and trace.answer is None
    small = asyncio.run(tree(Q, draft=endless, target=endless, judge=TextScore(), k=2, beam=2, max_depth=50,
                             token_budget=20))
    assert small.stop_reason == "token_budget" and small.search["num_tree_tokens"] >= 20
    capped = asyncio.run(tree(Q, draft=endless, target=endless, judge=TextScore(), k=2, beam=2, max_depth=50,
                              budget=Budget(max_tokens=9, max_step_tokens=4)))
    assert capped.stop_reason == "max_tokens" and capped.num_tokens >= 9


def test_tree_serializes_and_reloads():
    trace = asyncio.run(tree(Q, draft=Sampler("d", lambda p, s: f"x{s % 2} [s=7]\n\n" if depth_of(p) < 2 else "\\boxed{1} [s=8]"),
                             target=Sampler("t", lambda p, s: ""), judge=TextScore(), k=2, beam=2,
                             first_target_steps=0))
    again = Trace.from_json(trace.to_json())
    g1, g2 = load_tree(trace), load_tree(again)
    assert sorted(g1.nodes(data=True)) == sorted(g2.nodes(data=True)) and sorted(g1.edges) == sorted(g2.edges)
    # root, 2 children, 2 x 2 grandchildren (the beam keeps 2), then one answer each (equal samples merge)
    assert g1.number_of_nodes() == 1 + 2 + 4 + 2


def test_the_queue_batches_requests_from_many_callers_into_one_judge_call():
    judge = TextScore()
    queue = JudgeQueue(judge)

    async def caller(i):
        return await queue.judge([StepCandidate(Q, (), f"c{i} [s={i}]") for _ in range(2)])

    async def main():
        return await asyncio.gather(*(caller(i) for i in range(5)))

    results = asyncio.run(main())
    assert judge.calls == [10] and queue.stats.num_batches == 1 and queue.stats.batch_sizes == [10]
    assert [r[0].score for r in results] == [0, 1, 2, 3, 4]
    assert len(queue.stats.wait_seconds) == 10


def test_queue_shares_one_batch_across_problems_of_solve_many():
    def choose(prompt, seed):
        return "\\boxed{1} [s=7]" if depth_of(prompt) else f"step {seed % 3} [s=6]\n\n"

    judge = TextScore()
    r = Reasoner(Sampler("t", choose), Sampler("d", choose), strategy="tree", judge=judge, k=3, beam=2)
    solutions = r.solve_many(["q1?", "q2?", "q3?"])
    assert all(s.answer == "1" for s in solutions)
    assert judge.calls[0] == 9  # three problems' first-depth candidates in one judge call


# -- best-of-n --------------------------------------------------------------------------------


def test_best_of_n_votes_and_the_target_breaks_ties():
    def majority(prompt, seed):
        return ["x \\boxed{18}", "y \\boxed{18.0}", "z \\boxed{16}"][seed % 3]

    judge = TextScore()
    trace = asyncio.run(best_of_n(Q, draft=Sampler("d", majority), target=Sampler("t", majority), judge=judge, n=3,
                                  first_target_steps=0))
    assert trace.answer == "18" and trace.search["votes"] == {"18": 2, "16": 1} and judge.calls == []

    def tie(prompt, seed):
        return ["a \\boxed{1} [s=3]", "b \\boxed{2} [s=8]"][seed % 2]

    judge = TextScore()
    trace = asyncio.run(best_of_n(Q, draft=Sampler("d", tie), target=Sampler("t", tie), judge=judge, n=4,
                                  first_target_steps=0))
    assert trace.answer == "2" and judge.calls == [4] and trace.search["judged"]
    base = asyncio.run(best_of_n_target(Q, target=Sampler("t", tie), judge=TextScore(), n=2, vote="weighted"))
    assert base.answer == "2" and base.strategy == "best-of-n-target" and base.steps[0].author == "target"
    assert answer_key("1,000") == answer_key("1000.0") == "1000" and answer_key(None) is None



def test_best_of_n_under_step_verification_repairs_cut_steps_and_breaks_ties_by_plausible_share():
    def drafts(prompt, seed):
        i = seed % 10_007
        if depth_of(prompt) == 0:  # solution 0's first step is cut at its 2nd word
            return ["a BAD b\n\n", "x y [p=0.5]\n\n", "u v\n\n"][i]
        return ["\\boxed{4}", "\\boxed{5}", "no answer"][i]

    draft, target, judge = Sampler("d", drafts), Sampler("t", lambda p, s: "fixed.\n\n" if p.endswith("a ") else "?"), \
        WordVerifier()
    trace = asyncio.run(best_of_n(Q, draft=draft, target=target, judge=judge, n=3, first_target_steps=0))
    # one drafting call, one verifier batch per round, one repair call for the one cut step
    assert draft.batches == [3, 3] and judge.calls == [3, 3] and target.batches == [1]
    # 4 against 5, one vote each: shares 0.75 ((2 + 1) of 4 drafted words) against 0.625 (2.5 of 4)
    assert trace.search["votes"] == {"4": 1, "5": 1} and trace.answer == "4"
    assert [round(x["score"], 3) for x in trace.search["samples"]] == [0.75, 0.625, 1.0]
    first = trace.steps[0]
    assert first.author == "target" and first.text == "a fixed." and first.num_kept_tokens == 1
    assert first.draft_text == "a BAD b" and trace.steps[1].author == "draft"
    assert trace.search["options"]["verified"]
    # the target's own samples are scored by the verifier only when the vote needs it
    base = asyncio.run(best_of_n_target(Q, target=Sampler("t", lambda p, s: ["\\boxed{1}", "\\boxed{2} BAD"][s % 2]),
                                        judge=WordVerifier(), n=2))
    assert base.answer == "1" and not base.search["options"]["verified"]


def test_best_of_n_lets_the_target_sample_each_solution_s_opening_and_the_draft_write_on():
    def drafts(prompt, seed):
        return "so \\boxed{4}" if seed % 2 else "so BAD \\boxed{5}"

    def opening(prompt, seed):  # the target's first step differs by the solution's seed
        return f"plan {seed % 10_007}.\n\n" if depth_of(prompt) == 0 else "so \\boxed{4}"

    draft, target, judge = Sampler("d", drafts), Sampler("t", opening), WordVerifier()
    trace = asyncio.run(best_of_n(Q, draft=draft, target=target, judge=judge, n=3, first_target_steps=1,
                                  vote="weighted"))
    # one target call for the three openings, then the drafted steps (one call, one verifier
    # batch) and one repair call for the one cut (solution 1's): the openings are not judged
    assert target.batches == [3, 1] and draft.batches == [3] and judge.calls == [3]
    assert [s["text"].split("\n\n")[0] for s in trace.search["samples"]] == ["plan 0.", "plan 1.", "plan 2."]
    assert trace.search["votes"] == {"4": 3} and trace.search["options"]["first_target_steps"] == 1
    assert [s.author for s in trace.steps] == ["target", "draft"] and trace.steps[0].text == "plan 0."
    # the score counts drafted tokens only (the target's opening is not in it): 2 of 3 for the cut one
    assert [round(s["score"], 3) for s in trace.search["samples"]] == [1.0, 0.667, 1.0]

    # a whole-solution judge: the target's opening, then the draft samples the rest whole
    rated = asyncio.run(best_of_n(Q, draft=Sampler("d", lambda p, s: f"so \\boxed{{{s % 2}}} [s={3 + s % 2}]"),
                                  target=Sampler("t", opening), judge=TextScore(), n=2, first_target_steps=1))
    assert [s["text"] for s in rated.search["samples"]] == ["plan 0.\n\nso \\boxed{0} [s=3]",
                                                            "plan 1.\n\nso \\boxed{1} [s=4]"]
    assert rated.answer == "1" and [(s.index, s.author) for s in rated.steps] == [(0, "target"), (1, "draft")]
    assert rated.steps[0].text == "plan 1."
    # the target's own samples have no opening of their own: written whole, in one batch;
    # the twin takes no opening option (nor backoff): it never drafts
    twin = Sampler("t", opening)
    asyncio.run(best_of_n_target(Q, target=twin, judge=TextScore(), n=2))
    assert twin.batches == [2]
    for option in ("first_target_steps", "backoff"):
        with pytest.raises(StrategyError, match=f"'best-of-n-target' has no option '{option}'"):
            asyncio.run(best_of_n_target(Q, target=twin, judge=TextScore(), n=2, **{option: 1}))


def test_best_of_n_backs_off_to_whole_target_samples_when_drafting_does_not_pay_at_the_load():
    from stepspec.orchestrator.goodput import GoodputGovernor
    from stepspec.orchestrator.trace import Author

    def loaded(others):
        g = GoodputGovernor()
        for _ in range(others):
            g.enter()  # other problems in flight
        for _ in range(g.min_samples):  # measured with 8 in flight: a drafted round costs 10x more per token
            g.observe(Author.DRAFT, 8, 10, 10.0)
            g.observe(Author.TARGET, 8, 10, 1.0)
        return g

    def target_writes(prompt, seed):
        return "plan.\n\n" if depth_of(prompt) == 0 else "then \\boxed{4}"

    g = loaded(7)  # with this one, 8 in flight
    draft, target = Sampler("d", lambda p, s: "so \\boxed{5}"), Sampler("t", target_writes)
    trace = asyncio.run(best_of_n(Q, draft=draft, target=target, judge=WordVerifier(), n=3, first_target_steps=1,
                                  governor=g))
    # the openings, then the rest of all three whole in one call: no draft, no verifier
    assert draft.batches == [] and target.batches == [3, 3] and trace.answer == "4"
    assert [(s.author, s.backoff) for s in trace.steps] == [("target", False), ("target", True)]
    assert trace.num_backoff_steps == 1 and trace.search["options"]["backoff"]
    # the trace left the governor, which observed what the target wrote under its decision
    assert g.in_flight == 7 and g.buckets[8].num_samples[Author.TARGET] == g.min_samples + 1
    # alone, the same measurements: the draft drafts
    draft, target = Sampler("d", lambda p, s: "so \\boxed{5}"), Sampler("t", target_writes)
    alone = asyncio.run(best_of_n(Q, draft=draft, target=target, judge=WordVerifier(), n=3, first_target_steps=1,
                                  governor=loaded(0)))
    assert draft.batches == [3] and alone.answer == "5" and alone.num_backoff_steps == 0
    # without backoff, no governor: the draft drafts at any load
    draft = Sampler("d", lambda p, s: "so \\boxed{5}")
    asyncio.run(best_of_n(Q, draft=draft, target=Sampler("t", target_writes), judge=WordVerifier(), n=3,
                          first_target_steps=1, backoff=False, governor=loaded(7)))
    assert draft.batches == [3]


# -- tiny real models -------------------------------------------------------------------------


def cold(runner, *engines):
    """The engines, each with its caches reset: a test starts from nothing the one before cached."""
    for engine in engines:
        runner.run(engine.reset_caches())
    return engines


@pytest.mark.vllm
def test_tree_search_on_tiny_real_models(tiny_pair, runner):
    draft, target = cold(runner, *tiny_pair)
    r = Reasoner(target, draft, strategy="tree", judge="score", judge_options={"top_k": 512, "threshold": 0.0},
                 budget=Budget(max_tokens=24, max_step_tokens=6), k=3, beam=2, max_depth=3,
                 rules=__import__("stepspec.orchestrator.steps", fromlist=["StepRules"]).StepRules(delimiter="ge"))
    solutions = runner.run(r.asolve_many([Q, "What is 5 + 6?"]))
    for s in solutions:
        g = load_tree(Trace.from_json(s.trace.to_json()))
        for depth in range(1, 4):
            beam = [n for n in g.nodes if g.nodes[n]["depth"] == depth and g.nodes[n]["beam"]]
            assert len(beam) <= 2
        assert 1 <= len(s.trace.steps) <= 3 and s.trace.search["queue"]["num_candidates"] >= 3
        assert s.trace.num_generated_tokens["draft"] >= s.trace.num_tokens
    # both problems' first-depth candidates (3 each) went to the target in one batch
    assert solutions[0].trace.search["queue"]["max_batch_size"] >= 6


@pytest.mark.vllm
def test_search_on_the_likelihood_verifier_on_tiny_real_models(tiny_pair, runner):
    """The defaults on real vLLM: tree ranks branches by plausible share; best-of-n writes its
    sampled solutions under speculative sampling's test (cuts by ratio, a resampled token the
    target writes on from), all n per round in one batch."""
    from stepspec.orchestrator.steps import StepRules

    draft, target = cold(runner, *tiny_pair)
    opts = dict(budget=Budget(max_tokens=24, max_step_tokens=6, max_cut_steps=None), rules=StepRules(delimiter="ge"))
    searched = runner.run(Reasoner(target, draft, strategy="tree", k=3, beam=2, max_depth=3, **opts).asolve(Q)).trace
    voted = runner.run(Reasoner(target, draft, strategy="best-of-n", n=3, temperature=0.9, **opts).asolve(Q)).trace
    g = load_tree(searched)
    steps = [g.nodes[n] for n in g.nodes if n]
    assert steps and all(0.0 <= d["plausible"] <= 1.0 for d in steps)
    assert searched.search["branch_score"].startswith("plausible token share")
    assert voted.search["options"]["verified"] and len(voted.search["samples"]) == 3
    cuts = [c for x in voted.search["samples"] for c in x["cuts"]]
    assert cuts and all(c["rule"] == "ratio" and c["resampled_text"] for c in cuts)
    assert voted.num_generated_tokens["target"] > 0  # the target wrote on from each resampled token
    assert all(0.0 <= x["score"] <= 1.0 for x in voted.search["samples"])  # no answers: a tie, all scored


def test_tree_is_shown_in_the_terminal_and_drawn(tmp_path):
    from rich.console import Console

    from stepspec.workflows.cli.tree_view import draw_tree, rich_tree

    trace = asyncio.run(tree(Q, draft=Sampler("d", lambda p, s: f"x{s % 2} [s=7]\n\n" if depth_of(p) < 2 else "\\boxed{1} [s=8]"),
                             target=Sampler("t", lambda p, s: ""), judge=TextScore(), k=2, beam=2,
                             first_target_steps=0))
    console = Console(record=True, width=120)
    console.print(rich_tree(trace))
    shown = console.export_text()
    assert shown.count("draft 7.00") == 6 and shown.count("draft 8.00  \\boxed{1}") == 2
    assert shown.startswith("question: What is 3 + 4?") and "target" not in shown
    png = draw_tree(trace, tmp_path / "tree.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_search_strategies_run_in_the_bench_with_their_paired_baselines(tmp_path):
    from scripted import engines, write_problems
    from stepspec.workflows.eval.bench import BenchSettings
    from stepspec.workflows.eval.bench_run import run_bench

    data = write_problems(tmp_path / "p.jsonl", n=3)
    spec = BenchSettings(dataset=str(data), question_field="q", answer_field="a",
                     strategies=("target-only", "tree", "tree-target", "best-of-n", "best-of-n-target"),
                     strategy_options={"tree": {"k": 2, "beam": 2}, "tree-target": {"k": 2, "beam": 2},
                                       "best-of-n": {"n": 3}, "best-of-n-target": {"n": 3}})
    results = asyncio.run(run_bench(spec, tmp_path / "run", engines=engines()))
    r = results.results
    assert r["tree"].speedup.over == "tree-target" and r["best-of-n"].speedup.over == "best-of-n-target"
    assert r["tree-target"].speedup.over == "target-only" and r["tree-target"].accuracy["exact"] == 1.0
    assert all(r[s].num_problems == 3 for s in spec.strategies)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "(vs tree-target)" in report and "(vs best-of-n-target)" in report


@pytest.mark.vllm
def test_solve_shows_and_draws_the_tree_on_real_vllm(tmp_path_factory):
    import os
    import subprocess
    import sys

    from tiny_models import build_tiny_model

    target, draft = (build_tiny_model(tmp_path_factory.mktemp(f"st{seed}"), seed=seed, weight_std=0.5,
                                      tie_word_embeddings=False) for seed in (0, 1))
    out = tmp_path_factory.mktemp("tree")
    r = subprocess.run(
        [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "solve", "How many eggs are left?",
         "--strategy", "tree", "--opt", "k=2", "--opt", "beam=2", "--opt", "max_depth=3",
         "--judge-opt", "floor=-8", "--target", str(target), "--draft", str(draft), "--spec", "none",
         "--delimiter", "ge", "--max-step-tokens", "6", "--max-tokens", "24", "--kv-cache-gib", "0.25",
         "--max-model-len", "512", "--trace-out", str(out / "trace.json"), "--show-tree",
         "--tree-png", str(out / "tree.png")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-3000:]
    trace = Trace.from_json((out / "trace.json").read_text())
    g = load_tree(trace)
    assert "search tree" in r.stdout and r.stdout.count("draft ") >= g.number_of_nodes() - 1 - sum(
        1 for n in g.nodes if g.nodes[n].get("author") == "target")
    assert r.stdout.count("% plausible") >= g.number_of_nodes() - 1  # what each node's score is
    assert (out / "tree.png").read_bytes()[:4] == b"\x89PNG"
    assert trace.search["options"]["k"] == 2 and trace.search["queue"]["num_batches"] >= 1
