"""Routers: the protocol and threshold router, features, training, the router file,
tau selection, the arbitrage strategies, and collection on tiny real models."""

import asyncio
import json
from dataclasses import replace
import math
import os
import random
import re
import subprocess
import sys

import pytest

from fake_engine import ScriptedEngine
from stepspec.orchestrator.arbitrage import ArbitrageOracle
from stepspec.orchestrator.driver import StrategyOptions, drive
from strategy_runs import arbitrage, arbitrage_oracle
from strategy_runs import draft_only, target_only
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.routers.base import Action, Decision, RouterError, RoutingExample, RoutingState
from stepspec.routers.features import HEAD_TOKENS, SCALAR_FEATURES, FeatureSet, featurize, scalar_features
from stepspec.routers.learned import LearnedOptions, LearnedRouter
from stepspec.routers.registry import make_router, router_options_model
from stepspec.routers.threshold import ThresholdOptions, ThresholdRouter
from stepspec.routers.train import (
    CurvePoint,
    choose_tau,
    read_examples,
    roc_auc,
    routing_curve,
    train_router,
)

Q = "Janet's ducks lay 16 eggs. She eats 3 and bakes with 4. She sells the rest at $2. How much?"
TARGET_STEPS = ("16 - 3 - 4 = 9 eggs are left.\n\n", "9 * 2 = 18.\n\n", "The answer is \\boxed{18}.")
DRAFT_STEPS = ("16 - 3 = 13 eggs.\n\n", "13 - 4 = 8 eggs.\n\n", "So she makes \\boxed{16}.")


def script(steps, name="scripted", token_logprob=None, next_token=None):
    def continuation(prompt: str) -> str:
        n = prompt.split("<|assistant|>")[-1].count("\n\n")
        return steps[min(n, len(steps) - 1)]

    return ScriptedEngine(name, continuation=continuation, token_logprob=token_logprob, next_token=next_token)


def state(step="13 - 4 = 9 eggs.", lps=(-0.1, -0.2), ents=(0.3, 0.5), prev=(), authors=(), complete=True):
    return RoutingState(Q, tuple(prev), tuple(authors), step, tuple(lps), tuple(ents), complete)


class ScriptedRouter:
    """Decides by the drafted step's text: ``actions`` maps a substring to an action."""

    name = "scripted"

    def __init__(self, actions: dict[str, str], default: str = Action.KEEP):
        self.actions, self.default = actions, default
        self.seen: list[RoutingState] = []

    async def route(self, states):
        self.seen.extend(states)
        out = []
        for s in states:
            action = next((a for key, a in self.actions.items() if key in s.draft_step), self.default)
            out.append(Decision(action, 0.9 if action != Action.KEEP else 0.1, self.name))
        return out


# -- protocol, threshold router, features ------------------------------------------------


def test_threshold_router_follows_the_worked_example():
    lps = tuple(math.log(p) for p in (0.9, 0.8, 0.3))
    (mean,) = asyncio.run(ThresholdRouter(min_confidence=0.6).route([state(lps=lps, ents=())]))
    assert mean.action == Action.KEEP and mean.p_target == pytest.approx(1 - 0.6, abs=0.01)
    (low,) = asyncio.run(ThresholdRouter(min_confidence=0.6, statistic="min").route([state(lps=lps, ents=())]))
    assert low.action == Action.TARGET and low.p_target == pytest.approx(0.7)
    with pytest.raises(RouterError, match="without token logprobs"):
        asyncio.run(ThresholdRouter().route([state(lps=(), ents=())]))
    with pytest.raises(RouterError, match="statistic"):
        ThresholdRouter(statistic="median")
    with pytest.raises(ValueError, match="unknown routing action"):
        Decision("maybe", 0.5, "x")


def test_router_options_models_hold_the_defaults_and_name_mistakes(tmp_path):
    # built without options, a router uses its options model's defaults (the constructor's before)
    assert ThresholdOptions().model_dump() == {"min_confidence": 0.6, "statistic": "mean"}
    for router in (ThresholdRouter(), make_router("threshold")):
        assert router.options == ThresholdOptions() and (router.min_confidence, router.statistic) == (0.6, "mean")
    assert LearnedOptions().model_dump() == {"tau": None}  # None: the tau the file was saved with
    assert all(f.description for m in (ThresholdOptions, LearnedOptions) for f in m.model_fields.values())
    tuned = ThresholdOptions(min_confidence=0.3)
    assert make_router("threshold", min_confidence=0.3).options == ThresholdRouter(tuned).options == tuned
    # the options model by spec, for checking options without building the router (no file is read)
    path = str(tmp_path / "none.pt")
    assert router_options_model("threshold") is ThresholdOptions and router_options_model(path) is LearnedOptions
    assert router_options_model(path).build(tau="0.4").tau == 0.4
    with pytest.raises(RouterError, match="unknown router 'treshold'. Did you mean 'threshold'"):
        router_options_model("treshold")
    for spec, options, message in [
            ("threshold", dict(min_confidence=2), ": min_confidence must be within 0..1, got 2"),
            ("threshold", dict(statistic="median"),
             ": statistic must be 'mean' or 'min', got 'median'. Did you mean 'mean'"),
            ("threshold", dict(min_confidense=0.5), " has no option 'min_confidense'. Did you mean 'min_confidence'\\? "
                                                    "Its options: min_confidence, statistic"),
            (path, dict(tua=0.3), " has no option 'tua'. Did you mean 'tau'\\? Its options: tau"),
            (path, dict(tau=1.5), ": tau must be within 0..1, or None, got 1.5")]:
        with pytest.raises(RouterError, match=re.escape(f"router '{spec}'") + message):
            make_router(spec, **options)
        with pytest.raises(RouterError, match=message):  # the same check, the router not built
            router_options_model(spec).build(**options)


def test_scalar_features_read_the_step_and_the_history():
    f = dict(zip(SCALAR_FEATURES, scalar_features(state(
        step="2. Wait, let me check: 13 - 4 = 9, so \\boxed{18}", lps=(math.log(0.9), math.log(0.4)),
        ents=(0.2, 1.0), prev=("a", "b", "c"), authors=("draft", "target", "target"), complete=False))))
    assert f["mean_logprob"] == pytest.approx((math.log(0.9) + math.log(0.4)) / 2)
    assert f["min_logprob"] == pytest.approx(math.log(0.4)) and f["low_conf_share"] == 0.5
    assert f["mean_entropy"] == pytest.approx(0.6) and f["max_entropy"] == 1.0
    assert f["log_num_tokens"] == pytest.approx(math.log(3)) and f["log_position"] == pytest.approx(math.log(4))
    assert f["cut"] == 1.0 and f["opens_with_cue"] == 1.0 and f["num_cue_words"] == 3  # wait, let me, check
    assert f["has_answer"] == 1.0 and f["log_num_numbers"] == pytest.approx(math.log(1 + 5))
    assert f["history_target_share"] == pytest.approx(2 / 3) and f["last_step_target"] == 1.0
    # the head features read only the first HEAD_TOKENS tokens
    assert f["head_mean_entropy"] == pytest.approx(0.6) and f["head_max_entropy"] == 1.0
    long = dict(zip(SCALAR_FEATURES, scalar_features(state(lps=(-0.1,) * HEAD_TOKENS + (-3.0,) * 4,
                                                            ents=(0.5,) * HEAD_TOKENS + (2.0,) * 4))))
    assert long["head_mean_entropy"] == pytest.approx(0.5) and long["head_max_entropy"] == 0.5
    assert long["head_mean_logprob"] == pytest.approx(-0.1) and long["max_entropy"] == 2.0
    plain = dict(zip(SCALAR_FEATURES, scalar_features(state(step="Then 9 * 2 = 18 dollars."))))
    assert plain["opens_with_cue"] == 0 and plain["history_target_share"] == 0 and plain["cut"] == 0


def test_featurize_with_the_bundled_embedding():
    pytest.importorskip("sentence_transformers", reason="the bundled embedding needs stepspec[models]")
    x = featurize([state(step="16 - 3 = 13 eggs."), state(step="Wait, that is wrong.")], FeatureSet())
    assert x.shape == (2, len(FeatureSet().names)) == (2, len(SCALAR_FEATURES) + 384)
    emb = x[:, len(SCALAR_FEATURES):]
    assert emb[0] @ emb[0] == pytest.approx(1, abs=1e-4) and abs(emb[0] @ emb[1]) < 0.9


# -- training on synthetic data ----------------------------------------------------------


def synthetic(n_problems=60, steps=8, seed=0, shuffle=False):
    """Steps whose labels are planted in the draft's confidence: a step the draft wrote
    unsure (mean logprob low) is one the target writes better and the verifier cuts, most
    of the time."""
    rng = random.Random(seed)
    examples = []
    for p in range(n_problems):
        for i in range(steps):
            unsure = rng.random() < 0.3
            mean_lp = rng.uniform(-2.5, -1.2) if unsure else rng.uniform(-0.6, -0.05)
            lps = tuple(mean_lp + rng.gauss(0, 0.1) for _ in range(10))
            better = unsure if rng.random() < 0.95 else not unsure
            q_draft = rng.uniform(4, 8)
            q_target = q_draft + (rng.uniform(1, 3) if better else rng.uniform(-1, 0.3))
            s = RoutingState(f"problem {p}", tuple(f"s{j}" for j in range(i)), ("draft",) * i, f"step {i}", lps,
                             tuple(0.5 for _ in lps))
            examples.append(RoutingExample(f"p{p}", s, f"target step {i}", q_draft, q_target, 10,
                                           12 if better else 9, "score", verifier_cut=better,
                                           verifier_plausible=0.8 if better else 1.0))
    if shuffle:
        labels = [(ex.draft_quality, ex.target_quality, ex.verifier_cut) for ex in examples]
        rng.shuffle(labels)
        examples = [RoutingExample(ex.problem_id, ex.state, ex.target_step, a, b, ex.num_draft_tokens,
                                   ex.num_target_tokens, ex.judge, verifier_cut=c)
                    for ex, (a, b, c) in zip(examples, labels)]
    return examples


@pytest.mark.parametrize("label", ["verifier", "advantage"])
def test_training_recovers_a_planted_signal_and_not_shuffled_labels(torch, label):
    planted = train_router(synthetic(), label=label, embedding=False, target_budget=0.4, epochs=300)
    assert planted.metrics["auc_held_out"] > 0.8 and planted.metrics["label"] == label
    shuffled = train_router(synthetic(shuffle=True), label=label, embedding=False, target_budget=0.4, epochs=300)
    assert abs(shuffled.metrics["auc_held_out"] - 0.5) < 0.12
    # held out by problem: no problem on both sides
    m = planted.metrics
    assert m["num_train_problems"] + m["num_held_out_problems"] == 60 and m["num_held_out"] == 8 * 15


def test_tau_meets_the_target_budget_on_held_out_data(torch):
    for budget in (0.1, 0.25, 0.5):
        report = train_router(synthetic(seed=3), embedding=False, target_budget=budget, epochs=200)
        at = report.metrics["held_out_at_tau"]
        assert at["target_call_share"] <= budget
        # the lowest such tau: one step lower would break the budget
        lower = [c for c in report.curve if c.tau < report.router.tau]
        assert not lower or max(lower, key=lambda c: c.tau).target_call_share > budget
        assert report.metrics["goal_met"]


def test_match_specreason_picks_the_fewest_target_tokens_at_its_quality(torch):
    report = train_router(synthetic(seed=4), label="advantage", embedding=False, match_specreason=True,
                          specreason_threshold=6.0)
    m = report.metrics
    spec = m["held_out_references"]["specreason"]
    # the planted signal lets the router reach specreason's held-out quality ...
    assert m["goal_met"]
    assert m["held_out_at_tau"]["mean_quality"] >= spec["mean_quality"] - 1e-9
    # ... at the tau with the fewest target tokens among those that do, far fewer than specreason's
    meeting = [c for c in report.curve if c.mean_quality >= spec["mean_quality"] - 1e-9]
    assert m["held_out_at_tau"]["target_token_share"] == min(c.target_token_share for c in meeting)
    assert m["held_out_at_tau"]["target_token_share"] < spec["target_token_share"] / 2
    # choose_tau on its own: the goal unreachable is said (False), not hidden
    curve = [CurvePoint(0.2, 0.5, 0.5, 7.0), CurvePoint(0.6, 0.1, 0.1, 6.0)]
    assert choose_tau(curve, min_quality=6.5) == (curve[0], True)
    assert choose_tau(curve, min_quality=9.0) == (curve[0], False)  # said, not hidden
    with pytest.raises(RouterError, match="one goal"):
        choose_tau(curve)


def test_roc_auc_and_curve_basics():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert roc_auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
    assert roc_auc([1, 1], [0.1, 0.2]) is None
    ex = synthetic(n_problems=1, steps=4)
    curve = routing_curve([0.9, 0.1, 0.5, 0.3], ex)
    assert curve[-1].target_call_share == 0 and curve[0].target_call_share == 1


def test_one_class_and_bad_goals_are_clear_errors():
    ex = [RoutingExample(e.problem_id, e.state, e.target_step, 5.0, 5.0, 1, 1, "score") for e in synthetic(10, 3)]
    with pytest.raises(RouterError, match="one class"):
        train_router(ex, label="advantage", embedding=False, target_budget=0.3)
    with pytest.raises(RouterError, match="none of the 30 steps carries the 'verifier'.*stepspec router verify"):
        train_router(ex, embedding=False, target_budget=0.3)  # collected, not verified
    uncut = [replace(e, verifier_cut=False) for e in ex]
    with pytest.raises(RouterError, match="one class only \\(0 of"):
        train_router(uncut, embedding=False, target_budget=0.3)
    with pytest.raises(RouterError, match="label 'advantage'"):
        train_router(synthetic(), embedding=False, match_specreason=True)
    with pytest.raises(RouterError, match="unknown label 'quality'"):
        train_router(synthetic(), label="quality", embedding=False, target_budget=0.3)
    with pytest.raises(RouterError, match="exactly one way"):
        train_router(synthetic(), embedding=False, target_budget=0.3, tau=0.5)


# -- the router file ---------------------------------------------------------------------


def test_router_file_round_trip_and_version_mismatch(tmp_path, torch):
    report = train_router(synthetic(), embedding=False, target_budget=0.3, epochs=100)
    path = report.router.save(tmp_path / "r.pt")
    loaded = LearnedRouter.load(path)
    states = [ex.state for ex in synthetic(n_problems=2, seed=9)]
    assert loaded.tau == report.router.tau and loaded.feature_set == report.router.feature_set
    assert (loaded.predict(states) == report.router.predict(states)).all()
    assert loaded.metadata["auc_held_out"] == report.metrics["auc_held_out"]
    assert LearnedRouter.load(path, tau=0.99).tau == 0.99
    assert make_router(str(path)).tau == loaded.tau and make_router(str(path), tau=0.99).tau == 0.99
    decisions = asyncio.run(loaded.route(states))
    assert [d.action for d in decisions] == [Action.TARGET if d.p_target >= loaded.tau else Action.KEEP for d in decisions]

    payload = torch.load(path, weights_only=True)
    payload["feature_version"] = 0
    torch.save(payload, tmp_path / "old.pt")
    with pytest.raises(RouterError, match="feature set version 0.*Retrain"):
        LearnedRouter.load(tmp_path / "old.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a router")
    with pytest.raises(RouterError, match="not a readable stepspec router file"):
        LearnedRouter.load(tmp_path / "junk.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(RouterError, match="no 'stepspec-router' format tag"):
        LearnedRouter.load(tmp_path / "other.pt")
    with pytest.raises(RouterError, match="does not exist"):
        LearnedRouter.load(tmp_path / "missing.pt")
    with pytest.raises(RouterError, match="does not exist"):  # a router path given to a Reasoner
        Reasoner(script(TARGET_STEPS), script(DRAFT_STEPS), strategy="arbitrage", router=str(tmp_path / "none.pt"))


def test_router_train_and_info_cli(tmp_path, torch):
    data = tmp_path / "collected"
    data.mkdir()
    lines = [json.dumps(ex.to_dict()) for ex in synthetic()]
    (data / "examples.jsonl").write_text("\n".join(lines) + "\n" + lines[0][:50])  # a cut-off last line
    cli = [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "router"]
    env = {**os.environ, "COLUMNS": "300"}  # no wrapped lines
    r = subprocess.run(cli + ["train", str(data), "--out", str(tmp_path / "r.pt"), "--no-embedding",
                              "--target-budget", "0.3"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = " ".join(r.stdout.split())
    assert "ROC-AUC" in out and "goal met" in out and "1 cut-off line" in out
    info = subprocess.run(cli + ["info", str(tmp_path / "r.pt")], capture_output=True, text=True, timeout=300,
                          env=env)
    shown = " ".join(info.stdout.split())
    assert info.returncode == 0 and "feature set v2" in shown and "logistic regression" in shown
    (data / "examples.jsonl").write_text("{broken\n" + "\n".join(lines) + "\n")
    bad = subprocess.run(cli + ["train", str(data), "--out", str(tmp_path / "x.pt")], capture_output=True, text=True,
                         timeout=300, env=env)
    assert bad.returncode == 2 and "examples.jsonl:1: malformed example" in bad.stderr
    none = subprocess.run(cli + ["verify", str(tmp_path / "nothing")], capture_output=True, text=True, timeout=300,
                          env=env)
    assert none.returncode == 2 and "holds no collection" in none.stderr and "stepspec router collect" in none.stderr


def test_read_examples_keeps_the_latest_record_of_a_position(tmp_path):
    ex = synthetic(n_problems=1, steps=2)
    again = RoutingExample(ex[1].problem_id, ex[1].state, "recollected", 1.0, 2.0, 3, 4, "score")
    path = tmp_path / "examples.jsonl"
    path.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in [*ex, again]))
    examples, dropped = read_examples(path)
    assert dropped == 0 and len(examples) == 2 and examples[1].target_step == "recollected"
    assert examples[0] == ex[0]  # the JSON round trip is exact


# -- the strategies ----------------------------------------------------------------------


def test_arbitrage_keeps_routes_and_stops_as_the_router_says():
    router = ScriptedRouter({"8 eggs": Action.TARGET})
    draft = script(DRAFT_STEPS, "draft", token_logprob=lambda text: -0.5)
    trace = asyncio.run(arbitrage(Q, draft=draft, target=script(TARGET_STEPS, "target"), router=router,
                                  first_target_steps=0))
    assert [s.author for s in trace.steps] == ["draft", "target", "draft"]
    assert trace.steps[1].draft_text == "13 - 4 = 8 eggs." and trace.steps[1].accepted is False
    assert trace.steps[1].text == "9 * 2 = 18." and trace.steps[1].score == 0.9 and trace.steps[1].judge == "scripted"
    assert router.seen[1].previous_authors == ("draft",) and router.seen[2].previous_authors == ("draft", "target")
    assert all(len(s.token_logprobs) == len(s.draft_step.split()) for s in router.seen)
    assert trace.num_judge_calls == 0 and trace.answer == "16"

    # the two ends of any router: keep all = draft-only's text, route all = target-only's
    keep_all = asyncio.run(arbitrage(Q, draft=script(DRAFT_STEPS), target=script(TARGET_STEPS),
                                     router=ScriptedRouter({}, Action.KEEP), first_target_steps=0))
    assert keep_all.text == asyncio.run(draft_only(Q, draft=script(DRAFT_STEPS))).text
    route_all = asyncio.run(arbitrage(Q, draft=script(DRAFT_STEPS), target=script(TARGET_STEPS),
                                      router=ScriptedRouter({}, Action.TARGET)))
    assert route_all.text == asyncio.run(target_only(Q, target=script(TARGET_STEPS))).text

    # stop: the drafted step is dropped and the target writes the rest in one piece
    stopped = asyncio.run(arbitrage(Q, draft=script(DRAFT_STEPS), target=script(("It is \\boxed{18}.",)),
                                    router=ScriptedRouter({"8 eggs": Action.STOP}), first_target_steps=0))
    assert [s.author for s in stopped.steps] == ["draft", "target"] and stopped.answer == "18"


def score_by_number(prompt: str):
    """A judge engine that rates a step 9 when its last line has a 9 or 18 in it, else 2."""
    reasoning = prompt.split("<|assistant|>")[-2].split("\n<|user|>")[0]
    last = reasoning.split("\n\n")[-1]
    return [("9", 0.0)] if ("9" in last or "18" in last) else [("2", 0.0)]


def test_arbitrage_oracle_keeps_the_better_step_and_reports_both():
    from stepspec.judges.score import ScoreJudge

    examples = []
    target = script(TARGET_STEPS, "target", next_token=score_by_number)
    draft = script((*DRAFT_STEPS[:2], "So she makes \\boxed{18}."), "draft", token_logprob=lambda t: -0.3)
    oracle = ArbitrageOracle(StrategyOptions(), ScoreJudge(target), on_example=examples.append, problem_id="p0")
    trace = asyncio.run(drive(oracle, Q, {"draft": draft, "target": target}))
    # rated 2 against 9 twice (the target's step stays), then 9 against 9 (a tie keeps the draft's)
    assert [s.author for s in trace.steps] == ["target", "target", "draft"]
    assert trace.text == "16 - 3 - 4 = 9 eggs are left.\n\n9 * 2 = 18.\n\nSo she makes \\boxed{18}."
    assert trace.steps[2].num_verify_tokens == 4 and trace.steps[2].num_target_tokens == 0
    assert len(examples) == len(trace.steps) and all(ex.problem_id == "p0" for ex in examples)
    first = examples[0]
    assert (first.draft_quality, first.target_quality, first.advantage) == (2.0, 9.0, 7.0)
    assert first.state.draft_step == "16 - 3 = 13 eggs." and first.target_step == "16 - 3 - 4 = 9 eggs are left."
    assert len(first.state.token_logprobs) == first.num_draft_tokens == 6
    assert trace.steps[0].score == 2.0 and trace.steps[0].target_score == 9.0
    assert trace.num_judge_calls == 2 * len(trace.steps)
    # the same step from both: rated once, a tie, the draft's stays
    same = asyncio.run(arbitrage_oracle(Q, draft=script(TARGET_STEPS), target=target, judge=ScoreJudge(target)))
    assert same.num_judge_calls == len(same.steps) == 3 and all(s.author == "draft" for s in same.steps)
    assert all(s.score == s.target_score == 9.0 for s in same.steps)


def test_reasoner_wires_routers_and_refuses_bad_ones(tmp_path):
    t, d = script(TARGET_STEPS), script(DRAFT_STEPS, token_logprob=lambda text: -3.0 if "8" in text else -0.1)
    r = Reasoner(t, d, strategy="arbitrage", router="threshold", router_options={"min_confidence": 0.5},
                 first_target_steps=0)
    trace = r.solve(Q).trace
    assert [s.author for s in trace.steps] == ["draft", "target", "draft"]
    r.close()
    with pytest.raises(RouterError, match="needs a router"):
        Reasoner(t, d, strategy="arbitrage")
    with pytest.raises(RouterError, match="takes no router"):
        Reasoner(t, d, strategy="specreason", router="threshold")
    with pytest.raises(RouterError, match="unknown router 'treshold'"):
        Reasoner(t, d, strategy="arbitrage", router="treshold")
    with pytest.raises(RouterError, match="router 'threshold' has no option 'tau'. Its options: min_confidence, "
                                          "statistic"):
        Reasoner(t, d, strategy="arbitrage", router="threshold", router_options={"tau": 0.3})
    from stepspec.judges.base import JudgeError

    with pytest.raises(JudgeError, match="rates each candidate"):
        asyncio.run(arbitrage_oracle(Q, draft=d, target=t, judge=_Compare()))


class _Compare:
    name, needs_target_step, needs_draft_tokens, draft_top_k = "exact", True, False, 0

    async def judge(self, candidates):
        raise AssertionError("not reached")


def test_arbitrage_runs_in_the_bench_beside_the_others(tmp_path):
    from scripted import engines, write_problems
    from stepspec.workflows.eval.bench import BenchSettings
    from stepspec.workflows.eval.bench_run import run_bench
    from stepspec.workflows.eval.rundir import read_samples

    data = write_problems(tmp_path / "p.jsonl", n=4)
    spec = BenchSettings(dataset=str(data), question_field="q", answer_field="a",
                     strategies=("target-only", "specreason", "arbitrage", "arbitrage-oracle"),
                     strategy_options={"arbitrage": {"router": "threshold"}, "specreason": {"judge": "score"}})
    results = asyncio.run(run_bench(spec, tmp_path / "run", engines=engines()))
    assert results.status == "complete"
    assert results.run.sessions[-1].routers == {
        "arbitrage": {"name": "threshold", "min_confidence": 0.6, "statistic": "mean"}}
    for s in spec.strategies:
        assert results.results[s].num_problems == 4
    oracle = read_samples(tmp_path / "run" / "samples_p_arbitrage-oracle.jsonl")
    # the judge rates a wrong boxed answer 0 and the target is always right: the oracle is always right
    assert all(r.is_correct("exact") for r in oracle)


# -- collection on tiny real models ------------------------------------------------------


@pytest.mark.vllm
def test_collect_on_tiny_real_models_writes_well_formed_records_and_resumes(tmp_path_factory):
    from tiny_models import build_tiny_model
    from conftest import tiny_engine
    from stepspec.workflows.routing.collect import CollectError, CollectSettings, collect

    tmp = tmp_path_factory.mktemp("collect")
    paths = [build_tiny_model(tmp_path_factory.mktemp(f"m{s}"), seed=s, weight_std=0.5, tie_word_embeddings=False)
             for s in (0, 1)]
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"Tom has {n} apples and buys 3 more. How many?",
                                        "answer": str(n + 3)}) + "\n" for n in (4, 7, 9)))
    spec = CollectSettings(source=str(data), num_problems=3, target=str(paths[0]), draft=str(paths[1]),
                       target_spec="none", delimiter="ge", max_step_tokens=8, max_tokens=24, max_steps=3,
                       judge_options={"top_k": 512})  # the whole tiny vocabulary: the digits are always there

    async def run(spec, concurrency):
        target, draft = tiny_engine(paths[0], max_logprobs=512), tiny_engine(paths[1], max_logprobs=512)
        try:
            return await collect(spec, tmp / "out", concurrency=concurrency, engines=(target, draft))
        finally:
            await target.close()
            await draft.close()

    first = asyncio.run(run(spec, 3))
    assert first["num_problems"] == 3 and first["num_examples"] >= 3
    examples, dropped = read_examples(tmp / "out" / "examples.jsonl")
    assert dropped == 0 and {ex.problem_id for ex in examples} == {f"{data}:0:{i}" for i in range(3)}
    for ex in examples:
        assert ex.judge == "score" and ex.draft_quality is not None and 0 <= ex.draft_quality <= 9
        assert ex.target_quality is not None and 0 <= ex.target_quality <= 9
        assert len(ex.state.token_logprobs) == len(ex.state.token_entropies) == ex.num_draft_tokens > 0
        assert all(lp <= 0 for lp in ex.state.token_logprobs) and all(e >= 0 for e in ex.state.token_entropies)
        assert len(ex.state.previous_authors) == ex.state.position
    problems = [json.loads(line) for line in (tmp / "out" / "problems.jsonl").read_text().splitlines()]
    assert len(problems) == 3 and all(p["num_steps"] >= 1 for p in problems)

    lines = len((tmp / "out" / "examples.jsonl").read_text().splitlines())
    again = asyncio.run(run(spec, 1))  # every problem finished: nothing collected again
    assert again["num_problems"] == 3 and len((tmp / "out" / "examples.jsonl").read_text().splitlines()) == lines
    saved = json.loads((tmp / "out" / "collect.json").read_text())
    assert len(saved["sessions"]) == 2 and saved["sessions"][0]["num_examples"] == lines
    # what each engine computed in, as the probe chose it on this machine ("auto" alone says nothing)
    engines = saved["sessions"][0]["engines"]
    assert [engines[role]["model"] for role in ("target", "draft")] == [str(paths[0]), str(paths[1])]
    assert {engines[role]["dtype"] for role in ("target", "draft")} <= {"float32", "bfloat16"}

    with pytest.raises(CollectError, match="holds a collection with other settings.*max_tokens"):
        asyncio.run(collect(spec.model_copy(update={"max_tokens": 30}), tmp / "out"))


def test_collect_refuses_evaluation_problems(tmp_path):
    from stepspec.workflows.eval.datasets import load_dataset
    from stepspec.workflows.routing.collect import CollectError, CollectSettings, training_problems

    gsm = load_dataset("gsm8k").problems
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"question": "A fresh question: 2 + 2?", "answer": "4"}) + "\n"
                    + json.dumps({"question": gsm[5].question, "answer": "1"}) + "\n")
    with pytest.raises(CollectError, match="1 questions \\(lines 2\\) are in the evaluation sets or near dup"):
        training_problems(CollectSettings(source=str(data)))
    with pytest.raises(CollectError, match="evaluation set"):
        training_problems(CollectSettings(source="gsm8k"))


def test_collect_generates_training_problems_reproducibly():
    pytest.importorskip("reasoning_gym", reason="generated problems need stepspec[router]")
    from stepspec.workflows.routing.collect import CollectError, CollectSettings, training_problems

    generated = training_problems(CollectSettings(num_problems=5, seed=1))
    assert CollectSettings().source == "generated"
    assert len(generated) == 5 and all(p.question and p.reference.strip() for p in generated)
    assert [p.question for p in generated] == [p.question for p in
                                               training_problems(CollectSettings(num_problems=5, seed=1))]
    with pytest.raises(CollectError, match="GSM8K test problems"):
        training_problems(CollectSettings(source="gsm-symbolic"))


def test_router_collect_cli_refuses_an_evaluation_set_before_loading_models(tmp_path):
    cli = [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "router", "collect"]
    r = subprocess.run(cli + ["--source", "gsm8k", "--output-dir", str(tmp_path / "c")], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert r.returncode == 2 and "is an evaluation set" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "c").exists()


# -- the verifier's labels ---------------------------------------------------------------


def write_collection(directory, examples):
    from stepspec.workflows.routing.collect import CollectSettings

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "collect.json").write_text(json.dumps({"config": CollectSettings().model_dump(mode="json"),
                                                        "sessions": []}))
    (directory / "examples.jsonl").write_text("".join(json.dumps(ex.to_dict()) + "\n" for ex in examples))


def test_verify_labels_each_collected_step_once_and_train_reads_the_labels(tmp_path):
    from stepspec.routers.train import read_collection
    from stepspec.workflows.routing.verify import verify_collection

    def example(pid, prev, step, complete=True):
        s = RoutingState("How many eggs?", tuple(prev), ("draft",) * len(prev), step, (-0.1,) * len(step.split()),
                         (0.2,) * len(step.split()), complete)
        return RoutingExample(pid, s, "target step", None, None, len(step.split()), 2, "score")

    examples = [example("p0", [], "She has 16 eggs."), example("p0", ["She has 16 eggs."], "16 - 3 = 14 eggs."),
                example("p1", [], "Tom runs 5 km", complete=False), example("p2", [], ""),
                example("p3", [], "So \\boxed{13}.")]
    write_collection(tmp_path / "c", examples)
    # the target: "14" is implausible (logprob -9, rank 4; it would write "13"), every other token its top choice
    target = ScriptedEngine("target", token_scores=lambda prefix, tokens: [
        (-9.0, 4, " 13") if t.strip() == "14" else (-0.1, 1, None) for t in tokens])
    progress = []
    result = asyncio.run(verify_collection(tmp_path / "c", batch_size=2, engine=target,
                                           on_batch=lambda done, total: progress.append((done, total))))
    assert progress == [(2, 5), (4, 5), (5, 5)] and result["num_verified"] == 5
    assert result["cut_share"] == pytest.approx(1 / 5)
    # what the target read: the chat, the previous steps each ended by the delimiter, then the
    # drafted step's tokens and its stop as generation ended it: the delimiter after a complete
    # step, nothing at the token cap or after a boxed answer
    (p0, t0), (p1, t1), (p2, t2), (p3, t3) = target.scored
    assert p1 == p0 + "She has 16 eggs.\n\n" and t1 == ["16", " -", " 3", " =", " 14", " eggs.", "\n\n"]
    assert "".join(t0) == "She has 16 eggs.\n\n" and "".join(t2) == "Tom runs 5 km"
    assert "".join(t3) == "So \\boxed{13}."
    by_key = {(ex.problem_id, ex.state.position): ex for ex in read_collection(tmp_path / "c")[0]}
    cut = by_key[("p0", 1)]
    assert cut.verifier_cut is True and 0 < cut.verifier_plausible < 1
    assert by_key[("p0", 0)].verifier_cut is False and by_key[("p0", 0)].verifier_plausible == 1.0
    assert by_key[("p2", 0)].verifier_cut is False  # an empty step: nothing scored, nothing to cut
    verdict = json.loads((tmp_path / "c" / "verdicts.jsonl").read_text().splitlines()[1])
    assert verdict["cut_token"].strip() == "14" and verdict["cut_logprob"] == -9.0

    # run again: nothing is scored twice; other options on the same verdicts are refused
    asyncio.run(verify_collection(tmp_path / "c", engine=target))
    assert len(target.scored) == 4
    with pytest.raises(RouterError, match="other likelihood options"):
        asyncio.run(verify_collection(tmp_path / "c", judge_options={"floor": -3}, engine=target))
    with pytest.raises(Exception, match="floor"):  # a bad option is named before any model loads
        asyncio.run(verify_collection(tmp_path / "c", judge_options={"floor": 3}))


def test_verifier_label_defaults_to_the_cut_share_and_reports_missed_cuts(torch):
    report = train_router(synthetic(seed=5), embedding=False, epochs=200)
    m = report.metrics
    assert m["goal"]["target_budget"] == pytest.approx(m["positive_share_train"])
    assert m["held_out_at_tau"]["target_call_share"] <= m["positive_share_train"]
    ref = m["held_out_references"]["specreason-likelihood"]
    assert ref["missed_cut_share"] == 0 and ref["target_call_share"] == pytest.approx(m["positive_share_held_out"])
    assert m["held_out_references"]["draft-only"]["missed_cut_share"] == 1
    # the planted signal: the router catches most cut steps at specreason-likelihood's number of calls
    assert m["held_out_at_tau"]["missed_cut_share"] < 0.3
