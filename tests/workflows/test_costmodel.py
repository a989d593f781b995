"""The cost model (stepspec/workflows/eval/costmodel.py): calls reconstructed from step records, a fit
that recovers the costs it is given, pricing that names what it cannot price, the shipped
profiles, and `stepspec bench cost` end to end on a run it writes itself."""

import json
from dataclasses import replace

import pytest

from stepspec.common.states import Author
from stepspec.orchestrator.trace import StepRecord, StopReason, Trace
from stepspec.workflows.eval.costmodel import (ANY_METHOD, ArmMethods, CostModelError, CostProfile, Op, OpCost, Usage, fit,
                                      load_profiles, opening_tokens, predict, ratio_profile, trace_usage)

QUESTION = "Janet's ducks lay 16 eggs per day. How many are left?"  # 55 characters: 14 opening tokens
SUFFIX = ArmMethods(target="suffix", draft="suffix")


def _trace(steps, calls, generated):
    return Trace(question=QUESTION, strategy="specreason", steps=tuple(steps), answer=None,
                 stop_reason=StopReason.ANSWER, seconds=1.0, num_generate_calls=calls, num_generated_tokens=generated)


def specreason_trace():
    """The target opens (10 tokens); the draft writes 40, cut at 30, the target writes the token
    at the cut; the draft writes 20, accepted."""
    return _trace([
        StepRecord(0, Author.TARGET, "a", num_target_tokens=10, target_seconds=1.0),
        StepRecord(1, Author.TARGET, "b", draft_text="b'", accepted=False, num_draft_tokens=40, num_kept_tokens=30,
                   cut={"offset": 30}, num_target_tokens=1, draft_seconds=2.0, judge_seconds=0.5, target_seconds=0.3,
                   complete=False),
        StepRecord(2, Author.DRAFT, "c", draft_text="c", accepted=True, num_draft_tokens=20, draft_seconds=1.0,
                   judge_seconds=0.4),
    ], calls={"target": 2, "draft": 2}, generated={"target": 11, "draft": 60})


def test_a_traces_calls_are_reconstructed_from_its_records():
    usage = trace_usage(specreason_trace(), SUFFIX)
    opening = opening_tokens(QUESTION)
    assert opening == 14
    # the draft: its first call prefills the opening and the target's 10; its second the target's token at the cut
    assert usage[(Op.DRAFT_WRITE, "suffix")] == Usage(2, opening + 10 + 1, 60, 3.0)
    # verifications: the drafted 40 (after the target's own 10, cached), then the 20 (its token at the cut is its own)
    assert usage[(Op.VERIFY, "suffix")] == Usage(2, 40 + 20, 0, 0.9)
    # the target: the opening prefilled once; the token at the cut after the kept 30 (cached by the verification)
    assert usage[(Op.TARGET_WRITE, "suffix")] == Usage(2, opening + 0, 11, 1.3)


def test_one_generation_of_several_steps_is_one_call():
    steps = [StepRecord(i, Author.TARGET, "s", num_target_tokens=50, target_seconds=2.0) for i in range(4)]
    usage = trace_usage(_trace(steps, {"target": 1}, {"target": 230}), ArmMethods(target="draft"))
    assert usage == {(Op.TARGET_WRITE, "draft"): Usage(1, opening_tokens(QUESTION), 230, 8.0)}


def test_the_fit_recovers_the_costs_that_made_the_seconds():
    truth = {(Op.DRAFT_WRITE, "suffix"): OpCost(0.1, 0.002, 0.03), (Op.VERIFY, "suffix"): OpCost(0.3, 0.008),
             (Op.TARGET_WRITE, "suffix"): OpCost(0.25, 0.006, 0.08)}
    usages = []
    for i in range(12):
        shapes = {(Op.DRAFT_WRITE, "suffix"): Usage(3 + i % 4, 40 + 7 * i, 100 + 13 * i),
                  (Op.VERIFY, "suffix"): Usage(3 + i % 4, 90 + 11 * i * (i % 3)),
                  (Op.TARGET_WRITE, "suffix"): Usage(1 + i % 3, 30 + 5 * (i % 5), 20 + 9 * i)}
        usages.append({k: Usage(u.calls, u.prefill, u.decode, truth[k].seconds(u)) for k, u in shapes.items()})
    fitted = fit(usages, "synthetic")
    for key, cost in truth.items():
        assert fitted.costs[key].per_call == pytest.approx(cost.per_call, abs=1e-9)
        assert fitted.costs[key].per_prefill_token == pytest.approx(cost.per_prefill_token, abs=1e-9)
        assert fitted.costs[key].per_decode_token == pytest.approx(cost.per_decode_token, abs=1e-9)
    assert predict(usages[3], fitted) == pytest.approx(sum(u.seconds for u in usages[3].values()))


def test_no_fitted_cost_is_negative():
    # seconds that fall with more calls: the per-call cost is held at 0, not fitted negative
    usages = [{(Op.VERIFY, "x"): Usage(c, 10 * c + 5, 0, 1.0 - 0.01 * c + 0.05 * (10 * c + 5))} for c in range(1, 9)]
    cost = fit(usages, "t").costs[(Op.VERIFY, "x")]
    assert cost.per_call >= 0 and cost.per_prefill_token > 0


def test_pricing_an_operation_the_profile_lacks_names_it_and_the_fix():
    profile = CostProfile("cpu", {(Op.VERIFY, "suffix"): OpCost(0.3, 0.01)})
    with pytest.raises(CostModelError, match=r"no cost for 'target verifies' with token method 'draft'.*fit it on"):
        predict({(Op.VERIFY, "draft"): Usage(1, 10)}, profile)
    anything = CostProfile("gpu", {(Op.VERIFY, ANY_METHOD): OpCost(0.01, 0.001)})
    assert predict({(Op.VERIFY, "draft"): Usage(2, 10)}, anything) == pytest.approx(0.03)


def test_the_shipped_profiles_each_cite_a_source_and_price_every_operation():
    profiles = load_profiles()
    assert len(profiles) >= 3
    for p in profiles:
        assert "benchmark" in p.source or "arXiv" in p.source
        for op in Op:
            assert p.cost((op, "suffix")).per_call > 0


def test_a_malformed_profiles_file_is_named_with_the_fix(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("profiles:\n  - name: broken\n    source: x\n    costs:\n      target writes: {per_call: 1}\n")
    with pytest.raises(CostModelError, match=r"p.yaml: profile 1 \(broken\) is malformed.*per_prefill_token"):
        load_profiles(path)
    path.write_text("profiles: [")
    with pytest.raises(CostModelError, match="cannot read the cost profiles"):
        load_profiles(path)


def test_a_cheaper_draft_or_verification_never_predicts_a_slower_specreason():
    usage_sr, usage_to = trace_usage(specreason_trace(), SUFFIX), {
        (Op.TARGET_WRITE, "suffix"): Usage(1, opening_tokens(QUESTION), 71)}
    ratios = [predict(usage_to, ratio_profile(d, v, 1)) / predict(usage_sr, ratio_profile(d, v, 1))
              for d in (0.6, 0.3, 0.1) for v in (0.1, 0.01)]
    assert ratios[0] < ratios[2] < ratios[4] and ratios[1] < ratios[3] < ratios[5]
    assert all(ratios[i] < ratios[i + 1] for i in (0, 2, 4))  # cheaper prefill at the same draft ratio


def _timed(trace, truth):
    """``trace`` with each operation's seconds under ``truth`` shared among the records that call it."""
    usage = {op: u for (op, _), u in trace_usage(trace, SUFFIX).items()}
    calls = {Op.DRAFT_WRITE: [s.draft_text is not None or s.author is Author.DRAFT for s in trace.steps],
             Op.VERIFY: [s.draft_text is not None for s in trace.steps],
             Op.TARGET_WRITE: [s.author is Author.TARGET for s in trace.steps]}
    share = {op: truth[(op, "suffix")].seconds(usage[op]) / sum(calls[op]) for op in usage}
    steps = [replace(s, **{field: share[op] if calls[op][i] else 0.0 for op, field in
                           ((Op.DRAFT_WRITE, "draft_seconds"), (Op.VERIFY, "judge_seconds"),
                            (Op.TARGET_WRITE, "target_seconds")) if op in share})
             for i, s in enumerate(trace.steps)]
    return replace(trace, steps=tuple(steps), seconds=sum(share[op] * sum(calls[op]) for op in share))


def _write_run(root, seconds_per_token):
    """A small bench run: target-only (one generation) and specreason, 6 problems, whose seconds
    follow known costs (the target decoding at ``seconds_per_token``)."""
    from stepspec.workflows.eval.results import SCHEMA_VERSION

    truth = {(Op.TARGET_WRITE, "suffix"): OpCost(0.3, 0.005, seconds_per_token),
             (Op.VERIFY, "suffix"): OpCost(0.3, 0.008), (Op.DRAFT_WRITE, "suffix"): OpCost(0.1, 0.002, 0.03)}
    root.mkdir()
    samples = {}
    for arm in ("target-only", "specreason"):
        lines = []
        for i in range(6):
            if arm == "specreason":
                trace = _trace(specreason_trace().steps, {"target": 2 + i % 2, "draft": 2 + i},
                               {"target": 11 + i, "draft": 60 + 10 * i})
            else:
                trace = _trace([StepRecord(0, Author.TARGET, "x", num_target_tokens=60 + 10 * i)],
                               {"target": 1}, {"target": 60 + 10 * i})
            trace = _timed(trace, truth)
            lines.append(json.dumps({"schema_version": SCHEMA_VERSION, "doc_id": i, "strategy": arm,
                                     "correct": {"m": True}, "seconds": trace.seconds, "stats": {"num_tokens": 71},
                                     "trace": json.loads(trace.to_json())}))
        samples[arm] = f"samples_{arm}.jsonl"
        (root / samples[arm]).write_text("\n".join(lines) + "\n")
    results = {"schema_version": SCHEMA_VERSION, "status": "complete", "baseline": "target-only",
               "config": {"dataset": "t", "strategies": ["target-only", "specreason"], "draft_spec": "suffix"},
               "run": {"problem_ids": list(range(6)), "samples": samples, "metrics": ["m"],
                       "sessions": [{"started": "2026-12-06T00:00:00+00:00", "hardware": {"cpu": "Test CPU"}}],
                       "arms": {a: {"strategy": a, "target_spec": "suffix"} for a in samples}}}
    (root / "results_2026-12-06T00-00-00.json").write_text(json.dumps(results))
    return root


def test_bench_cost_fits_one_run_checks_another_and_prices_the_published_profiles(tmp_path):
    from typer.testing import CliRunner

    from stepspec.workflows.cli.app import app

    fitted, checked = _write_run(tmp_path / "fit", 0.08), _write_run(tmp_path / "check", 0.088)
    out = tmp_path / "cost.md"
    r = CliRunner().invoke(app, ["bench", "cost", str(fitted), "--check", str(checked), "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "| target writes | suffix | 0.300 | 0.0050 | 0.0800 |" in text  # the fit recovers the costs
    assert "| fit | Test CPU | fitted | specreason |" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| check |")]
    errors = {row[3]: float(row[6].rstrip("% |")) for row in rows}
    # the checked run's target decodes 10% slower: target-only, all target decoding, is predicted faster
    # than measured by more than specreason, whose target writes a few tokens
    assert -10 < errors["target-only"] < errors["specreason"] < 0
    assert "A100, 32B target + 1.5B draft" in text and "by cost ratio" in text
    bad = CliRunner().invoke(app, ["bench", "cost", str(fitted), "--baseline", "nobody"])
    assert bad.exit_code == 2 and "baseline arm 'nobody' is not among the run's arms" in bad.output
