"""Scripted runs of every strategy, and the traces they wrote, kept as a file.

``tests/data/traces_v1.jsonl`` holds the trace of each scenario below as the code
of its time wrote it (one JSON line per scenario: {"scenario", "trace"}). The
tests load it with today's code (old traces stay readable, and serialize back to
the same JSON) and run the scenarios again (the same steps, stop reasons and
counters: only the timings differ). Regenerate after a deliberate change:

    python tests/support/trace_scenarios.py tests/data/traces_v1.jsonl

Only public entry points with keyword options, so this runs against older code too.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import ScriptedEngine

from stepspec.engine.protocol import EngineError
from stepspec.engine.types import Completion, FinishReason, GenerationResult
from stepspec.judges.base import Verdict
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.run import ReasoningError

Q = "Janet's ducks lay 16 eggs. She eats 3 and bakes with 4. She sells the rest at $2. How much?"
TARGET_STEPS = ("16 - 3 - 4 = 9 eggs are left.\n\n", "9 * 2 = 18.\n\n", "The answer is \\boxed{18}.")
DRAFT_STEPS = ("16 - 3 = 13 eggs.\n\n", "13 - 4 = 9 eggs.\n\n", "So she makes \\boxed{18}.")
BUDGET = Budget(max_steps=64, max_tokens=1024, max_step_tokens=256)  # explicit: no default differs

# Timing fields: they differ from run to run (everything else must not).
TIMINGS = {"seconds", "model_seconds", "draft_seconds", "judge_seconds", "target_seconds", "wait_seconds_p50",
           "wait_seconds_max"}


def script(*steps: str, name: str = "scripted", **kwargs: Any) -> ScriptedEngine:
    """Writes steps[n] when the prompt already holds n steps."""

    def continuation(prompt: str) -> str:
        return steps[min(prompt.split("<|assistant|>")[-1].count("\n\n"), len(steps) - 1)]

    return ScriptedEngine(name, continuation=continuation, **kwargs)


class Judge:
    """Rejects drafted steps containing ``bad``; scores by a "[s=N]" tag when there is one."""

    needs_target_step = needs_draft_tokens = False
    draft_top_k = 0

    def __init__(self, bad: str = "\0", name: str = "custom"):
        self.bad, self.name = bad, name

    async def judge(self, candidates):
        out = []
        for c in candidates:
            m = re.search(r"\[s=(\d+)\]", c.draft_step)
            score = float(m.group(1)) if m else (1.0 if self.bad not in c.draft_step else 0.0)
            out.append(Verdict(self.name, self.bad not in c.draft_step and score >= 1, score=score,
                               num_judge_calls=1))
        return out


class Router:
    name = "scripted"

    def __init__(self, actions: dict[str, str]):
        self.actions = actions

    async def route(self, states):
        from stepspec.routers.base import Decision

        out = []
        for s in states:
            action = next((a for key, a in self.actions.items() if key in s.draft_step), "keep")
            out.append(Decision(action, 0.9 if action != "keep" else 0.1, self.name))
        return out


class Sampler(ScriptedEngine):
    """Writes ``choose(prompt, seed)``: sampled siblings differ by their seeds."""

    def __init__(self, name, choose):
        super().__init__(name)
        self.choose = choose

    async def generate(self, requests):
        out = []
        for r in requests:
            text = self.choose(str(r.prompt), r.sampling.seed)
            reason, stop_string = FinishReason.EOS, None
            hits = [(text.index(s), s) for s in r.sampling.stop if s in text]
            if hits:
                at, stop_string = min(hits)
                text, reason = text[:at], FinishReason.STOP
            out.append(GenerationResult((Completion(text, tuple(range(len(text.split()))), reason, stop_string),), 1))
        return out


def depth_of(prompt: str) -> int:
    return prompt.split("<|assistant|>")[-1].count("\n\n")


def thinking_model() -> ScriptedEngine:
    thinking = ["<think>\nFirst, 16 - 3 - 4 = 9.\n\n", "Maybe \\boxed{17}.\n\n", "No: 9 * 2 = 18.</think>\n\n"]

    def model(prompt):
        body = prompt.split("<|assistant|>")[-1]
        return "The answer is \\boxed{18}." if "</think>" in body else thinking[min(body.count("\n\n"), 2)]

    return ScriptedEngine(continuation=model)


def dying(after: int) -> ScriptedEngine:
    calls = {"n": 0}

    def dies(prompt):
        calls["n"] += 1
        if calls["n"] > after:
            raise EngineError("engine 'draft': vLLM engine core died")
        return DRAFT_STEPS[min(depth_of(prompt), 2)]

    return ScriptedEngine(continuation=dies)


def cutting_target() -> ScriptedEngine:
    def target_writes(prompt: str) -> str:
        if prompt.endswith("13 - 4 ="):
            return " 9 eggs.\n\n"
        return "9 * 2 = 18, so \\boxed{18}." if prompt.endswith("\n\n") and "9 eggs" in prompt else "?\n\n"

    return ScriptedEngine("target", continuation=target_writes, token_scores=lambda prefix, tokens: [
        (-9.0, 4, " 9") if t == " 8" or t == "So" else (-0.2, 1, None) for t in tokens])


def scenarios() -> dict[str, Callable[[], Awaitable[Any]]]:
    from stepspec.judges.likelihood import LikelihoodJudge
    from strategy_runs import arbitrage, arbitrage_oracle
    from strategy_runs import draft_only, target_only
    from strategy_runs import best_of_n, best_of_n_target
    from strategy_runs import lookahead
    from strategy_runs import spec_thinking
    from strategy_runs import specreason
    from strategy_runs import tree, tree_target

    b = dict(budget=BUDGET)
    cut_draft = ("16 - 3 = 13 eggs.\n\n", "13 - 4 = 8 eggs.\n\n", "So she makes \\boxed{16}.")

    def cut_specreason():
        target = cutting_target()
        return specreason(Q, first_target_steps=0, draft_after_cut=0, draft=script(*cut_draft), target=target,
                          judge=LikelihoodJudge(target), **b)

    def cut_lookahead():
        target = cutting_target()
        return lookahead(Q, draft=script(*cut_draft), target=target, judge=LikelihoodJudge(target), gamma=2, **b)

    def tree_choose(prompt, seed):
        if depth_of(prompt) == 0:
            return ["a [s=9]\n\n", "b [s=7]\n\n", "c [s=3]\n\n"][seed % 3]
        branch = "a" if "a [s=9]" in prompt else "b"
        return {"a": ["\\boxed{1} [s=2]", "\\boxed{2} [s=6]"], "b": ["\\boxed{3} [s=9]", "\\boxed{4} [s=8]"]}[
            branch][seed % 2]

    def poor(prompt, seed):
        return "poor [s=0]\n\n" if depth_of(prompt) == 0 else "\\boxed{5} [s=6]"

    def tie(prompt, seed):
        return ["a \\boxed{1} [s=3]", "b \\boxed{2} [s=8]", "c \\boxed{2.0} [s=2]", "d \\boxed{1} [s=9]"][seed % 4]

    endless = ScriptedEngine(continuation=lambda p: f"step {p.count('step')}\n\n")
    return {
        "target-only": lambda: target_only(Q, target=script(*TARGET_STEPS), **b),
        "draft-only": lambda: draft_only(Q, draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS), **b),
        "target-only max_steps": lambda: target_only(Q, target=endless, budget=Budget(max_steps=3)),
        "target-only repetition": lambda: target_only(Q, target=ScriptedEngine(continuation=lambda p: "Hm.\n\n"),
                                                      **b),
        "target-only cut steps": lambda: target_only(
            Q, target=ScriptedEngine(continuation=lambda p: " ".join(["word"] * 50)),
            budget=Budget(max_step_tokens=10, max_tokens=40, max_cut_steps=None)),
        "target-only thinking": lambda: target_only(Q, target=thinking_model(), **b),
        "specreason": lambda: specreason(Q, first_target_steps=1, draft_opening=False, draft=script(*DRAFT_STEPS),
                                         target=script(*TARGET_STEPS), judge=Judge("13 - 4"), **b),
        "specreason thinking": lambda: specreason(Q, first_target_steps=0, draft=thinking_model(),
                                                  target=thinking_model(), judge=Judge(), **b),
        "specreason cut": cut_specreason,
        "specreason error": lambda: specreason(Q, first_target_steps=0, draft=dying(2), target=script(*TARGET_STEPS),
                                               judge=Judge(), **b),
        "lookahead": lambda: lookahead(Q, draft=script(*DRAFT_STEPS), target=script(*TARGET_STEPS),
                                       judge=Judge("13 - 4"), gamma=4, **b),
        "lookahead max_steps": lambda: lookahead(Q, draft=endless, target=endless, judge=Judge("step 5"), gamma=3,
                                                 adaptive=False, budget=Budget(max_steps=9)),
        "lookahead cut": cut_lookahead,
        "spec-thinking": lambda: spec_thinking(
            Q, draft=script("16 - 3 = 13 eggs.\n\n", "Wait, she bakes with 4.\n\n", "Wait, again?\n\n", "x\n\n",
                            "So \\boxed{18}."),
            target=script("t0\n\n", "She keeps 9 eggs and sells them for 9 * 2 dollars.\n\n",
                          "That is 18 dollars.\n\n", "t3\n\n", "t4 \\boxed{18}"), takeover_tokens=14, **b),
        "arbitrage": lambda: arbitrage(Q, draft=script(*cut_draft, token_logprob=lambda t: -0.5),
                                       target=script(*TARGET_STEPS), router=Router({"8 eggs": "target"}),
                                       first_target_steps=0, **b),
        "arbitrage stop": lambda: arbitrage(Q, draft=script(*cut_draft), target=script("It is \\boxed{18}."),
                                            router=Router({"8 eggs": "stop"}), first_target_steps=0, **b),
        "arbitrage-oracle": lambda: arbitrage_oracle(
            Q, draft=script("a [s=7]\n\n", "b [s=2]\n\n", "\\boxed{3} [s=5]"),
            target=script("a [s=7]\n\n", "B [s=8]\n\n", "\\boxed{4} [s=1]"), judge=Judge(), **b),
        "tree": lambda: tree(Q, draft=Sampler("draft", tree_choose), target=Sampler("target", tree_choose),
                             judge=Judge(), k=3, beam=2, max_depth=4, first_target_steps=0, **b),
        "tree poor": lambda: tree(Q, draft=Sampler("draft", poor), target=Sampler("t", lambda p, s: "own [s=8]\n\n"),
                                  judge=Judge(), k=3, beam=2, max_depth=3, first_target_steps=0, **b),
        "tree-target token_budget": lambda: tree_target(Q, target=Sampler("t", lambda p, s: f"more {s} [s=6]\n\n"),
                                                        judge=Judge(), k=2, beam=2, max_depth=50, token_budget=20,
                                                        **b),
        "tree max_depth": lambda: tree(Q, draft=Sampler("d", lambda p, s: f"more {s} [s=6]\n\n"),
                                       target=Sampler("t", lambda p, s: ""), judge=Judge(), k=2, beam=2,
                                       max_depth=3, first_target_steps=0, **b),
        "best-of-n": lambda: best_of_n(Q, draft=Sampler("d", tie), target=Sampler("t", tie), judge=Judge(), n=4,
                                       first_target_steps=0, **b),
        "best-of-n-target weighted": lambda: best_of_n_target(Q, target=Sampler("t", tie), judge=Judge(), n=3,
                                                              vote="weighted", **b),
    }


async def run_all() -> dict[str, Any]:
    """Each scenario's trace (a failed one: the trace its ReasoningError holds)."""
    traces = {}
    vocab, ScriptedEngine.vocab = ScriptedEngine.vocab, {}  # token ids as in a fresh process
    try:
        for name, make in scenarios().items():
            try:
                traces[name] = await make()
            except ReasoningError as e:
                traces[name] = e.trace
    finally:
        ScriptedEngine.vocab = vocab
    return traces


def without_timings(data: Any) -> Any:
    """A trace's JSON data with every timing field set to None."""
    if isinstance(data, dict):
        return {k: None if k in TIMINGS else without_timings(v) for k, v in data.items()}
    if isinstance(data, list):
        return [without_timings(x) for x in data]
    return data


if __name__ == "__main__":
    out = Path(sys.argv[1])
    traces = asyncio.run(run_all())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"scenario": name, "trace": json.loads(t.to_json())}) + "\n"
                           for name, t in traces.items()))
    print(f"{len(traces)} traces -> {out}")
