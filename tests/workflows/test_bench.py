"""`stepspec bench`: side-by-side runs, result files, resume, report (scripted engines),
and one run of the command on real vLLM with tiny models."""

import asyncio
import json
import subprocess
import sys

import pytest
from pydantic import BaseModel

from stepspec.engine.models import BUNDLED_DRAFT
from fake_engine import ScriptedEngine
from scripted import engines, write_problems
from stepspec.workflows.eval.bench import BenchSettings
from stepspec.workflows.eval.bench_run import run_bench
from stepspec.workflows.eval.results import Results, Sample
from stepspec.workflows.eval.rundir import BenchError, read_samples
from stepspec.workflows.eval.report import profile_table, table, wave_table
from stepspec.workflows.eval.summary import (PLOTS, acceptance_by_position, arm_twins, paired_counts, phase_profile,
                                    share_of_ceiling, summarize, summarize_run)

STRATEGIES = ("target-only", "draft-only", "specreason")


def spec_for(data, **kw):
    # the scripted target rates steps 0-9: specreason with the score judge
    kw.setdefault("strategy_options", {"specreason": {"judge": "score", "first_target_steps": 0}})
    return BenchSettings(dataset=str(data), question_field="q", answer_field="a", strategies=STRATEGIES, **kw)


class StopAfter:
    """A progress listener that presses Ctrl-C after ``n`` saved samples."""

    def __init__(self, n):
        self.n, self.seen = n, 0

    def start(self, strategies, num_problems, done, metric):
        self.metric = metric

    def sample(self, record):
        self.seen += 1
        if self.seen == self.n:
            raise KeyboardInterrupt


TIMING = {"seconds", "model_seconds", "draft_seconds", "judge_seconds", "target_seconds", "seconds_p50",
          "seconds_p90", "seconds_total", "output_tokens_per_second", "speedup", "orchestration_share", "run", "overhead",
          "versions", "git_hash", "judge_seconds_per_drafted_step", "judge_seconds_vs_score", "wall_seconds",
          "problems_per_minute", "session", "share", "tokens_per_second", "ceiling"}


def ran(coro):
    """A bench run's results file, as it was written."""
    return asyncio.run(coro).file()


def untimed(obj):
    """A result or sample with the wall-clock fields (which differ from run to run) and the
    session that solved it left out."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    if isinstance(obj, dict):
        return {k: untimed(v) for k, v in obj.items() if k not in TIMING}
    if isinstance(obj, list):
        return [untimed(v) for v in obj]
    return obj


def test_strategies_side_by_side_write_results_samples_and_report(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 4)
    results = ran(run_bench(spec_for(data), tmp_path / "run", engines=engines()))
    assert results["status"] == "complete"
    m = results["results"]
    assert m["target-only"]["accuracy"]["exact"] == 1.0
    assert m["draft-only"]["accuracy"]["exact"] == 0.5  # wrong on problems 1 and 3
    assert m["specreason"]["accuracy"]["exact"] == 1.0  # the judge caught both
    assert m["specreason"]["step_acceptance_rate"] == 6 / 8  # 4 plans + 2 right answers kept, 2 rejected
    assert m["draft-only"]["accuracy_stderr"]["exact"] == pytest.approx((0.25 / 3) ** 0.5)
    assert m["target-only"]["speedup"]["num_problems"] == 4 and m["target-only"]["target_token_share"] == 1.0
    assert set(m["specreason"]) >= {"seconds_p50", "seconds_p90", "output_tokens_per_second", "token_level",
                                    "orchestration_share", "num_judge_calls_mean"}
    run = tmp_path / "run"
    (results_file,) = run.glob("results_*.json")
    saved = json.loads(results_file.read_text())
    assert saved["config"]["strategies"] == list(STRATEGIES) and saved["run"]["problem_ids"] == [0, 1, 2, 3]
    assert "python" in saved["versions"] and "git_hash" in saved
    assert 0 <= saved["overhead"]["solve_share"] <= 1 and saved["overhead"]["loop_seconds"] > 0
    for s in STRATEGIES:
        rows = read_samples(run / f"samples_add_{s}.jsonl")
        assert [r.doc_id for r in rows] == [0, 1, 2, 3]
        assert {"question", "reference", "response", "answer", "correct", "trace", "seconds"} <= set(rows[0].line())
    # interleaved: on problem k the strategies start at position k (mod 3), so each goes first in turn
    firsts = [next(s for s in STRATEGIES if read_samples(run / f"samples_add_{s}.jsonl")[k].position == 0)
              for k in range(3)]
    assert firsts == list(STRATEGIES)
    report = (run / "report.md").read_text()
    assert "| specreason | 4 | 100.0% ± 0.0%" in report
    assert "## Where the time goes" in report and "share of ceiling" in report  # draft-only is the ceiling
    assert m["specreason"]["ceiling"]["arm"] == "draft-only"
    for plot in PLOTS:
        assert (run / plot).stat().st_size > 1000
    # the run is finished: resuming it solves nothing and changes no metric
    again = ran(run_bench(spec_for(data), run, resume=True, engines=engines()))
    assert untimed(again["results"]) == untimed(results["results"])
    assert len(again["run"]["sessions"]) == 1  # no session added: it had nothing to run


def test_resume_after_ctrl_c_gives_the_same_results_as_an_uninterrupted_run(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 5)
    whole = ran(run_bench(spec_for(data), tmp_path / "whole", engines=engines()))

    with pytest.raises(KeyboardInterrupt):
        ran(run_bench(spec_for(data), tmp_path / "cut", engines=engines(), progress=StopAfter(7)))
    (results_file,) = (tmp_path / "cut").glob("results_*.json")
    cut = json.loads(results_file.read_text())
    assert cut["status"] == "interrupted" and "KeyboardInterrupt" in cut["run"]["sessions"][0]["error"]
    assert sum(len(read_samples(f)) for f in (tmp_path / "cut").glob("samples_*.jsonl")) == 7
    # a later kill left half a line behind: it is dropped and that problem solved again
    with open(tmp_path / "cut" / "samples_add_specreason.jsonl", "a") as f:
        f.write('{"doc_id": 4, "strat')

    resumed = ran(run_bench(spec_for(data, limit=1), tmp_path / "cut", resume=True, engines=engines()))
    assert resumed["status"] == "complete" and len(resumed["run"]["sessions"]) == 2
    assert resumed["config"]["limit"] is None  # the run's own config, not the caller's
    assert untimed(resumed) == untimed(whole)
    for s in STRATEGIES:
        a = read_samples(tmp_path / "whole" / f"samples_add_{s}.jsonl")
        b = sorted(read_samples(tmp_path / "cut" / f"samples_add_{s}.jsonl"), key=lambda r: r.doc_id)
        assert untimed(a) == untimed(b)


def test_a_run_from_before_engines_took_a_dtype_resumes_in_float32_as_it_ran(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 2)
    ran(run_bench(spec_for(data), tmp_path / "run", engines=engines()))
    (results_file,) = (tmp_path / "run").glob("results_*.json")
    saved = json.loads(results_file.read_text())
    assert saved["config"]["target_dtype"] == saved["config"]["draft_dtype"] == "auto"  # a new run: auto
    for key in ("target_dtype", "draft_dtype"):
        del saved["config"][key]  # as an older run saved it: on a CPU, auto meant float32 then
    results_file.write_text(json.dumps(saved))
    resumed = ran(run_bench(spec_for(data), tmp_path / "run", resume=True, engines=engines()))
    assert resumed["config"]["target_dtype"] == resumed["config"]["draft_dtype"] == "float32"


def test_a_run_directory_is_not_overwritten_and_a_broken_samples_file_is_named(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 2)
    ran(run_bench(spec_for(data), tmp_path / "run", engines=engines()))
    with pytest.raises(BenchError, match="already holds a run; resume it with --resume"):
        ran(run_bench(spec_for(data), tmp_path / "run", engines=engines()))
    path = tmp_path / "run" / "samples_add_draft-only.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0][:20] + "\n" + lines[1] + "\n")
    with pytest.raises(BenchError, match=r"samples_add_draft-only.jsonl:1: malformed sample line"):
        ran(run_bench(spec_for(data), tmp_path / "run", resume=True, engines=engines()))
    with pytest.raises(BenchError, match="holds no results"):
        ran(run_bench(spec_for(data), tmp_path / "empty", resume=True, engines=engines()))


def test_bad_specs_fail_before_any_engine_starts(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 2)
    with pytest.raises(ValueError, match="unknown strategy 'spec-reason'"):
        ran(run_bench(spec_for(data).model_copy(update={"strategies": ("spec-reason",)}), tmp_path / "r"))
    with pytest.raises(ValueError, match="options given for strategies not in the run: lookahead"):
        ran(run_bench(spec_for(data, strategy_options={"lookahead": {"gamma": 2}}), tmp_path / "r"))
    with pytest.raises(ValueError, match="extra_forbidden|Extra inputs"):
        BenchSettings(datset="gsm8k")
    assert not (tmp_path / "r").exists()


def test_report_is_rebuilt_from_the_files_by_the_cli(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 3)
    ran(run_bench(spec_for(data), tmp_path / "run", engines=engines()))
    for f in ["report.md", *PLOTS]:
        (tmp_path / "run" / f).unlink()
    r = subprocess.run([sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "bench", "report",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "specreason" in r.stdout and "100.0%" in r.stdout
    assert "| draft-only | 3 | 66.7% ± 33.3%" in (tmp_path / "run" / "report.md").read_text()
    assert all((tmp_path / "run" / p).exists() for p in PLOTS)
    rows = read_samples(tmp_path / "run" / "samples_add_specreason.jsonl")
    assert acceptance_by_position(rows) == [(0, 3, 3), (1, 3, 2)]


@pytest.mark.parametrize("args, message", [
    (["--strategies", "target-only,spec-reason"], "unknown strategy 'spec-reason'"),
    (["--opt", "specreason.gamma=2"], "strategy 'specreason' has no option 'gamma'"),
    (["--opt", "lookahead.gamma=2", "--strategies", "specreason"], "strategy 'lookahead' is not in --strategies"),
    (["--opt", "gamma"], "--opt wants STRATEGY.KEY=VALUE"),
    (["--dataset", "gsm9k"], "unknown dataset 'gsm9k'"),
    (["--limit", "0"], "limit"),
    (["--grader", "exactish"], "unknown grader 'exactish'"),
    (["--strategies", "target-only,sr-score", "--opt", "sr-score.judge=score"],
     "unknown strategy 'sr-score'. Strategies: target-only, draft-only, specreason"),
    (["--strategies", "target-only,sr-score", "--opt", "sr-score.judge=score"],
     "To bench an arm under this label, give its strategy: --opt sr-score.strategy=NAME"),
    (["--strategies", "target-only,lookahed"], "unknown strategy 'lookahed'. Did you mean 'lookahead'?"),
    (["--strategies", "target-only,sr-score", "--opt", "sr-score.strategy=specreasn"],
     "unknown strategy 'specreasn'. Did you mean 'specreason'"),
    (["--strategies", "target-only,sr", "--opt", "sr.strategy=specreason", "--opt", "sr.gamma=2"],
     "arm 'sr' (specreason): strategy 'specreason' has no option 'gamma'"),
    (["--mode", "fast"], "--mode is latency, throughput or both"),
    (["--mode", "throughput", "--latency-limit", "5"], "apply to latency mode, which is not in this run"),
    (["--mode", "latency", "--throughput-wave", "5"], "--throughput-wave applies to throughput mode"),
    (["--mode", "throughput", "--throughput-wave", "0"], "bench: throughput_wave must be an integer >= 1, or None, got 0"),
    (["--mode", "both", "--latency-strategies", "target-only,sr"], "--latency-strategies: sr not in --strategies"),
])
def test_bench_cli_rejects_bad_options_before_loading_models(tmp_path, args, message):
    r = subprocess.run([sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "bench",
                        "--target", "/nonexistent-model", "--spec", "none", "--output-dir", str(tmp_path / "r"),
                        "--no-progress", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr


# -- arms and modes -------------------------------------------------------------------


class SlowEngine(ScriptedEngine):
    """A scripted engine whose calls take a little while, so that concurrent problems
    overlap; it counts the calls in flight at once and the prefix-cache resets."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight = self.max_in_flight = self.num_resets = 0

    async def _slow(self, call, *args):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.002)
            return await call(*args)
        finally:
            self.in_flight -= 1

    async def generate(self, requests):
        return await self._slow(super().generate, requests)

    async def next_token_logprobs(self, prompts, top_k=20):
        return await self._slow(super().next_token_logprobs, prompts, top_k)

    async def reset_caches(self):
        self.num_resets += 1


def slow_engines():
    target, draft = engines()
    return (SlowEngine("target", next_token=target._next_token, continuation=target._continuation),
            SlowEngine("draft", continuation=draft._continuation))


# Two arms of specreason: the strict one rejects the draft's wrong answers (1.0), the lax one
# (threshold 0) keeps every drafted step, so it is as wrong as the draft (0.5).
ARMS = ("target-only", "sr-strict", "sr-lax")
ARM_OPTIONS = {"sr-strict": {"strategy": "specreason", "judge": "score", "judge_options": {"threshold": 7},
                             "first_target_steps": 0},
               "sr-lax": {"strategy": "specreason", "judge": "score", "judge_options": {"threshold": 0},
                          "first_target_steps": 0}}


def arm_spec(data, options=ARM_OPTIONS, **kw):
    return BenchSettings(dataset=str(data), question_field="q", answer_field="a", strategies=ARMS,
                     strategy_options=options, **kw)


def test_arms_run_one_strategy_under_several_labels(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 4)
    results = ran(run_bench(arm_spec(data), tmp_path / "run", engines=engines()))
    m = results["results"]
    assert list(m) == list(ARMS)
    assert m["sr-strict"]["accuracy"]["exact"] == 1.0 and m["sr-lax"]["accuracy"]["exact"] == 0.5
    assert m["sr-lax"]["paired"] == {"over": "target-only", "metric": "exact", "num_problems": 4, "lost": 2,
                                     "gained": 0, "net": 2, "accuracy": 0.5, "baseline_accuracy": 1.0}
    assert results["run"]["arms"]["sr-lax"] == {"strategy": "specreason", "judge": "score", "router": None,
                                                "options": {"judge": "score", "judge_options": {"threshold": 0},
                                                            "first_target_steps": 0}, "target_spec": "suffix"}
    for arm in ARMS:
        rows = read_samples(tmp_path / "run" / f"samples_add_{arm}.jsonl")
        assert [r.doc_id for r in rows] == [0, 1, 2, 3] and {r.strategy for r in rows} == {arm}
    lax = read_samples(tmp_path / "run" / "samples_add_sr-lax.jsonl")
    assert {r.trace.strategy for r in lax} == {"specreason"}
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| sr-lax | latency | 4 | 50.0% ± 28.9% | 2 / 0 / net loss 2 |" in report
    assert ("* `sr-lax`: `specreason`; judge `score`; judge=\"score\", judge_options={\"threshold\": 0}, "
            "first_target_steps=0") in report
    # the saved config reads back: a resumed run finds every arm done
    again = ran(run_bench(arm_spec(data), tmp_path / "run", resume=True, engines=engines()))
    assert untimed(again["results"]) == untimed(results["results"])


def test_an_arm_without_a_strategy_fails_before_any_model_loads(tmp_path, monkeypatch):
    import stepspec.workflows.eval.bench_run as bench

    monkeypatch.setattr(bench, "build_engines", lambda *a, **k: pytest.fail("a model was loaded"))
    data = write_problems(tmp_path / "add.jsonl", 2)
    no_strategy = {k: {o: v for o, v in opts.items() if o != "strategy"} for k, opts in ARM_OPTIONS.items()}
    with pytest.raises(ValueError, match=r"unknown strategy 'sr-strict'\. .*--opt sr-strict\.strategy=NAME"):
        ran(run_bench(arm_spec(data).model_copy(update={"strategy_options": no_strategy}), tmp_path / "r"))
    with pytest.raises(ValueError, match="unknown strategy 'specreasn'. Did you mean 'specreason'"):
        ran(run_bench(arm_spec(data).model_copy(update={"strategy_options": {
            **ARM_OPTIONS, "sr-lax": {"strategy": "specreasn"}}}), tmp_path / "r"))
    with pytest.raises(ValueError, match="'specreason' is the name of a strategy"):
        ran(run_bench(spec_for(data, strategy_options={"specreason": {"strategy": "lookahead"}}),
                              tmp_path / "r"))
    with pytest.raises(ValueError, match="arm 'sr-lax' \\(specreason\\): .*threshold must be within 0..9"):
        ran(run_bench(arm_spec(data).model_copy(update={"strategy_options": {
            **ARM_OPTIONS, "sr-lax": {"strategy": "specreason", "judge": "score",
                                      "judge_options": {"threshold": 12}}}}), tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_throughput_mode_solves_all_problems_at_once_per_arm_and_saves_the_wall_time(tmp_path, monkeypatch):
    import stepspec.workflows.eval.bench_run as bench

    target, draft = slow_engines()
    built = {}

    def fake_build(configs, **kwargs):  # what run_bench asks of the vLLM engines
        built.update(configs)
        return {role: draft if role == "draft" else target for role in configs}

    monkeypatch.setattr(bench, "build_engines", fake_build)
    data = write_problems(tmp_path / "add.jsonl", 6)
    results = ran(run_bench(arm_spec(data, modes=("throughput",), max_num_seqs=4), tmp_path / "run"))
    # target-only's target and specreason's (each strategy's token method), one draft; raised to the problems at once
    assert {role: c.max_num_seqs for role, c in built.items()} == {"target (draft)": 6, "target (suffix)": 6, "draft": 6}
    assert results["status"] == "complete" and results["results"] == {}
    assert target.max_in_flight > 1  # the problems were in flight together
    # caches reset before each arm: every engine (here one scripted engine stands for both targets)
    assert target.num_resets == 2 * draft.num_resets == 2 * len(ARMS)
    run = tmp_path / "run"
    assert not list(run.glob("samples_add_sr-lax.jsonl"))  # no latency samples
    for arm in ARMS:
        rows = read_samples(run / f"samples_add_{arm}_throughput.jsonl")
        assert sorted(r.doc_id for r in rows) == list(range(6))
        assert {r.mode for r in rows} == {"throughput"} and {r.strategy for r in rows} == {arm}
        wall = results["run"]["throughput"][arm]
        assert wall["status"] == "complete" and wall["num_problems"] == 6 and wall["num_solved"] == 6
        assert wall["wall_seconds"] > 0
    tp = results["results_throughput"]
    assert tp["sr-strict"]["accuracy"]["exact"] == 1.0
    # sr-lax keeps the draft's wrong answers on odd problems, except where the goodput
    # governor, under load, had the target write a step instead (a backoff step)
    lax = read_samples(run / "samples_add_sr-lax_throughput.jsonl")
    wrong = {r.doc_id for r in lax if not r.correct["exact"]}
    assert wrong == {r.doc_id for r in lax if r.doc_id % 2
                     and all(step.author == "draft" for step in r.steps)}
    assert tp["sr-lax"]["paired"]["lost"] == tp["sr-lax"]["paired"]["net"] == len(wrong)
    assert tp["sr-lax"]["num_backoff_steps"] == sum(r.stats.num_backoff_steps for r in lax)
    walls = results["run"]["throughput"]
    assert tp["sr-lax"]["throughput"]["speedup"] == pytest.approx(walls["target-only"]["wall_seconds"]
                                                                  / walls["sr-lax"]["wall_seconds"])
    assert tp["target-only"]["throughput"]["speedup"] == 1.0
    report = (run / "report.md").read_text()
    assert "| sr-strict | throughput | 6 | 100.0% ± 0.0% | 0 / 0 / net 0 |" in report
    assert f"| sr-lax | throughput | 6 | {1 - len(wrong) / 6:.1%}" in report
    assert "**Throughput mode**" in report and "**Latency mode**" not in report
    assert all((run / p).stat().st_size > 1000 for p in PLOTS)


class CancelAfter:
    """Cancels the run after ``n`` saved samples, as Ctrl-C (SIGINT) does in the CLI."""

    def __init__(self, n):
        self.n, self.seen, self.main = n, 0, None

    def start(self, strategies, num_problems, done, metric):
        self.main = self.main or asyncio.current_task()

    def sample(self, record):
        self.seen += 1
        if self.seen == self.n:
            self.main.cancel()


def test_throughput_resume_skips_complete_arms_and_reruns_an_incomplete_one(tmp_path, caplog):
    data = write_problems(tmp_path / "add.jsonl", 4)
    run = tmp_path / "run"
    with pytest.raises(asyncio.CancelledError):  # stopped during sr-strict, the second arm
        ran(run_bench(arm_spec(data, modes=("throughput",)), run, engines=slow_engines(),
                              progress=CancelAfter(6)))
    (results_file,) = run.glob("results_*.json")
    cut = json.loads(results_file.read_text())
    assert cut["status"] == "interrupted"
    assert cut["run"]["throughput"]["target-only"]["status"] == "complete"
    assert cut["run"]["throughput"]["sr-strict"]["status"] == "interrupted"
    assert "sr-lax" not in cut["run"]["throughput"]
    first = (run / "samples_add_target-only_throughput.jsonl").read_text()
    assert 2 <= len(read_samples(run / "samples_add_sr-strict_throughput.jsonl")) <= 4

    target, draft = slow_engines()
    with caplog.at_level("WARNING", logger="stepspec.workflows.eval"):
        done = ran(run_bench(arm_spec(data), run, resume=True, engines=(target, draft)))
    assert "throughput arm sr-strict is incomplete" in caplog.text and "running it again" in caplog.text
    assert done["status"] == "complete" and done["config"]["modes"] == ["throughput"]  # the run's own config
    assert (run / "samples_add_target-only_throughput.jsonl").read_text() == first  # skipped, untouched
    assert target.num_resets == 2  # sr-strict and sr-lax ran, target-only did not
    for arm in ARMS:
        rows = read_samples(run / f"samples_add_{arm}_throughput.jsonl")
        assert sorted(r.doc_id for r in rows) == [0, 1, 2, 3]  # every problem once
        assert done["run"]["throughput"][arm]["status"] == "complete"
    assert done["results_throughput"]["sr-strict"]["accuracy"]["exact"] == 1.0
    # target-only was timed in the first session, the other arms in the second: no speedup across them
    assert [done["run"]["throughput"][arm]["waves"][0]["session"] for arm in ARMS] == [0, 1, 1]
    for arm in ("sr-strict", "sr-lax"):
        tp = done["results_throughput"][arm]["throughput"]
        assert tp["speedup"] is None and tp["other_session"] and tp["wall_seconds"] > 0
    assert "| not compared: timed in another session than the baseline |" in (run / "report.md").read_text()


def test_throughput_waves_interleave_the_arms_resume_by_wave_and_pair_waves_timed_in_one_session(tmp_path, caplog):
    data = write_problems(tmp_path / "add.jsonl", 6)
    run = tmp_path / "run"
    # sr-lax drafts at any load (no goodput governor), so it keeps the draft's wrong answer in each wave
    options = {**ARM_OPTIONS, "sr-lax": {**ARM_OPTIONS["sr-lax"], "backoff": False}}
    spec = arm_spec(data, options, modes=("throughput",), throughput_wave=2)  # waves {0, 1}, {2, 3}, {4, 5}
    # wave 1: target-only, sr-strict, sr-lax; wave 2 (rotated): sr-strict, sr-lax, target-only;
    # stopped at the 9th sample, inside sr-lax's wave 2
    with pytest.raises(asyncio.CancelledError):
        ran(run_bench(spec, run, engines=slow_engines(), progress=CancelAfter(9)))
    cut_results = json.loads(next(run.glob("results_*.json")).read_text())
    cut = cut_results["run"]["throughput"]
    assert [w["status"] for w in cut["target-only"]["waves"]] == ["complete"]
    assert [w["status"] for w in cut["sr-strict"]["waves"]] == ["complete", "complete"]
    assert [w["status"] for w in cut["sr-lax"]["waves"]] == ["complete", "interrupted"]
    assert [w["problems"] for w in cut["sr-strict"]["waves"]] == [[0, 1], [2, 3]]
    strict = (run / "samples_add_sr-strict_throughput.jsonl").read_text()
    header, rows = wave_table(Results.model_validate(cut_results), {arm: read_samples(run / f"samples_add_{arm}_throughput.jsonl")
                                            for arm in ARMS})
    col = {name: i for i, name in enumerate(header)}
    assert [row[col["sr-lax wall s (session)"]] for row in rows][1:] == ["interrupted", "not run"]
    assert [row[col["target-only wall s (session)"]] for row in rows][1:] == ["not run", "not run"]

    target, draft = slow_engines()
    with caplog.at_level("WARNING", logger="stepspec.workflows.eval"):
        done = ran(run_bench(spec, run, resume=True, engines=(target, draft)))
    assert "throughput arm sr-lax (wave 2 of 3) is incomplete" in caplog.text
    assert "status interrupted" in caplog.text  # the wave's record as the stopped session left it
    assert done["status"] == "complete"
    assert 1 < target.max_in_flight <= 2  # a wave's two problems at once, never more
    assert (run / "samples_add_sr-strict_throughput.jsonl").read_text().startswith(strict)  # kept, not re-solved
    walls = done["run"]["throughput"]
    for arm in ARMS:
        rows = read_samples(run / f"samples_add_{arm}_throughput.jsonl")
        assert sorted(r.doc_id for r in rows) == list(range(6))  # every problem once
        assert walls[arm]["status"] == "complete"
        assert walls[arm]["wall_seconds"] == pytest.approx(sum(w["wall_seconds"] for w in walls[arm]["waves"]))
    assert [w["session"] for w in walls["target-only"]["waves"]] == [0, 1, 1]
    assert [w["session"] for w in walls["sr-strict"]["waves"]] == [0, 0, 1]
    assert [w["session"] for w in walls["sr-lax"]["waves"]] == [0, 1, 1]
    # one goodput governor per arm: it goes on measuring across the waves, and a later session
    # (wave 3) restores what the last wave's had measured, as a server keeps it
    decided = [sum(w["governor"]["decisions"].values()) for w in walls["sr-strict"]["waves"]]
    assert decided[0] < decided[1] < decided[2]
    assert walls["target-only"]["waves"][0]["governor"] is None  # it drafts nothing
    base = [w["wall_seconds"] for w in walls["target-only"]["waves"]]
    strict_walls = [w["wall_seconds"] for w in walls["sr-strict"]["waves"]]
    tp = done["results_throughput"]
    # sr-strict's wave 2 was timed in the first session, target-only's in the second: left out
    assert tp["sr-strict"]["throughput"]["paired_waves"] == 2
    assert tp["sr-strict"]["throughput"]["speedup"] == pytest.approx((base[0] + base[2])
                                                                      / (strict_walls[0] + strict_walls[2]))
    assert tp["sr-lax"]["throughput"]["paired_waves"] == 3
    assert tp["sr-lax"]["throughput"]["speedup"] == pytest.approx(walls["target-only"]["wall_seconds"]
                                                                  / walls["sr-lax"]["wall_seconds"])
    report = (run / "report.md").read_text()
    assert f"{tp['sr-strict']['throughput']['speedup']:.2f}× (2 of 3 waves)" in report
    assert "in waves of 2" in report
    # the report's wave table: one row per wave, the draft wrong on odd problems (sr-lax loses one of each wave's
    # two), the speedup only where one session timed both arms
    header, rows = wave_table(Results.model_validate(done), {arm: read_samples(run / f"samples_add_{arm}_throughput.jsonl") for arm in ARMS})
    col = {name: i for i, name in enumerate(header)}
    assert [row[:2] for row in rows] == [["1", "#0-1"], ["2", "#2-3"], ["3", "#4-5"]]
    assert [row[col["sr-lax right"]] for row in rows] == ["1/2"] * 3
    assert [row[col["sr-lax vs target-only: lost / gained"]] for row in rows] == ["1 / 0"] * 3
    assert [row[col["sr-strict vs target-only: lost / gained"]] for row in rows] == ["0 / 0"] * 3
    assert [row[col["sr-strict wall s (session)"]][-3:] for row in rows] == ["(1)", "(1)", "(2)"]
    assert [row[col["sr-strict vs target-only: speedup"]] for row in rows] == [
        f"{base[0] / strict_walls[0]:.2f}×", "sessions differ", f"{base[2] / strict_walls[2]:.2f}×"]
    assert "## Throughput waves" in report and "| 2 | #2-3 |" in report


def test_a_resume_can_run_one_of_the_runs_modes_and_latency_pairs_within_a_session(tmp_path):
    """Throughput waves outlast the time at hand: the run resumes with modes=("latency",),
    which solves the latency problems and leaves the throughput waves as they were (the run
    is incomplete); a plain resume then finishes them. A latency speedup pairs only the
    problems one session solved in both arms."""
    data = write_problems(tmp_path / "add.jsonl", 4)
    run = tmp_path / "run"
    spec = arm_spec(data, modes=("throughput", "latency"), throughput_wave=2)
    with pytest.raises(asyncio.CancelledError):  # stopped in wave 2 of throughput, before any latency solve
        ran(run_bench(spec, run, engines=slow_engines(), progress=CancelAfter(8)))
    throughput_files = {arm: (run / f"samples_add_{arm}_throughput.jsonl").read_text() for arm in ARMS}
    with pytest.raises(BenchError, match=r"modes throughput are not among the run's \(latency\)"):
        ran(run_bench(arm_spec(data), tmp_path / "other", engines=engines(), modes=("throughput",)))

    part = ran(run_bench(spec, run, resume=True, engines=slow_engines(), modes=("latency",)))
    assert part["status"] == "incomplete" and part["run"]["sessions"][1]["modes"] == ["latency"]
    for arm in ARMS:
        rows = read_samples(run / f"samples_add_{arm}.jsonl")
        assert sorted(r.doc_id for r in rows) == [0, 1, 2, 3] and {r.session for r in rows} == {1}
        assert (run / f"samples_add_{arm}_throughput.jsonl").read_text() == throughput_files[arm]  # untouched
    assert part["run"]["throughput"]["sr-strict"]["waves"][1]["status"] == "interrupted"
    assert part["results"]["sr-strict"]["speedup"]["num_problems"] == 4
    assert "; latency only)" in (run / "report.md").read_text()  # the session that ran one mode
    with pytest.raises(BenchError, match=r"latency mode is done; resume it without a mode to run the rest "
                                         r"\(throughput\)"):
        ran(run_bench(spec, run, resume=True, engines=engines(), modes=("latency",)))

    done = ran(run_bench(spec, run, resume=True, engines=slow_engines()))
    assert done["status"] == "complete" and done["run"]["sessions"][-1]["modes"] == ["throughput", "latency"]
    for arm in ARMS:
        rows = read_samples(run / f"samples_add_{arm}_throughput.jsonl")
        assert sorted(r.doc_id for r in rows) == [0, 1, 2, 3]
        assert all(r.session == w["session"] for w in done["run"]["throughput"][arm]["waves"]
                   for r in rows if r.doc_id in w["problems"])

    # a problem whose two solves straddle sessions counts for accuracy, not for speed
    latency = {arm: read_samples(run / f"samples_add_{arm}.jsonl") for arm in ARMS}
    latency["sr-strict"][0].session = 2
    moved = summarize(latency, ["exact"], "target-only")["sr-strict"]
    assert moved.speedup.num_problems == 3 and moved.paired.num_problems == 4


def test_both_modes_with_a_latency_subset(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 5)
    target, draft = slow_engines()
    spec = arm_spec(data, modes=("throughput", "latency"), latency_limit=2,
                    latency_strategies=("target-only", "sr-lax"))
    results = ran(run_bench(spec, tmp_path / "run", engines=(target, draft)))
    run = tmp_path / "run"
    assert list(results["results"]) == ["target-only", "sr-lax"]
    assert [r.doc_id for r in read_samples(run / "samples_add_sr-lax.jsonl")] == [0, 1]
    assert not (run / "samples_add_sr-strict.jsonl").exists()
    assert all(len(read_samples(run / f"samples_add_{arm}_throughput.jsonl")) == 5 for arm in ARMS)
    # latency: one problem at a time, a reset before each of its 4 solves; throughput: one per arm
    assert target.num_resets == 4 + len(ARMS)
    lat = results["results"]["sr-lax"]
    assert lat["num_problems"] == 2 and lat["paired"]["lost"] == 1 and lat["speedup"]["num_problems"] == 2
    report = (run / "report.md").read_text()
    assert "| sr-strict | throughput | 5 | 100.0%" in report and "| sr-lax | latency | 2 | 50.0%" in report
    assert "| sr-strict | latency |" not in report
    assert "**Latency mode**: 2 problems" in report


def _record(doc, correct, seconds=1.0, drafted=0, judge_seconds=0.0, cut=0, backoff=0, steps=()):
    stats = {"num_tokens": 10, "num_accepted_steps": drafted - cut, "num_drafted_steps": drafted,
             "num_target_tokens": 5, "num_generated_tokens": {}, "num_target_calls": 1, "num_judge_calls": drafted,
             "spec_decoding": {}, "num_cut_steps": cut, "num_backoff_steps": backoff, "num_kept_draft_tokens": 0,
             "judge_seconds": judge_seconds}
    trace = {"question": "q", "strategy": "s", "steps": list(steps), "answer": None, "stop_reason": "answer",
             "seconds": seconds}
    return Sample.model_validate({"doc_id": doc, "strategy": "s", "correct": {"exact": correct}, "error": None,
                                  "seconds": seconds, "model_seconds": seconds, "stop_reason": "answer",
                                  "stats": stats, "trace": trace})


def test_paired_counts_and_judge_time_on_hand_made_records():
    base = [_record(d, c) for d, c in enumerate([True, True, True, False, False])]
    arm = [_record(d, c, drafted=4, judge_seconds=2.0, cut=1, backoff=2)
           for d, c in enumerate([False, True, True, True, False, True])]  # doc 5: no baseline to pair with
    worse = [_record(d, c, drafted=2, judge_seconds=0.5) for d, c in enumerate([False, False, True, False, False])]
    assert paired_counts(arm, base, "exact").model_dump() == {
        "metric": "exact", "num_problems": 5, "lost": 1, "gained": 1, "net": 0, "accuracy": 0.6,
        "baseline_accuracy": 0.6, "over": None}
    out = summarize({"target-only": base, "lik": arm, "sr-score": worse}, ["exact"],
                    judges={"lik": "likelihood", "sr-score": "score", "target-only": None})
    score = out["sr-score"].paired
    assert (score.lost, score.gained, score.net, score.over) == (2, 0, 2, "target-only")
    assert out["target-only"].paired.net == 0
    assert out["lik"].num_cut_steps == 6 and out["lik"].num_backoff_steps == 12
    assert out["lik"].judge_seconds_per_drafted_step == 0.5  # 12 s over 24 drafted steps
    assert out["sr-score"].judge_seconds_per_drafted_step == 0.25
    assert out["lik"].judge_seconds_vs_score.model_dump() == {"over": "sr-score", "ratio": 2.0}
    assert out["target-only"].judge_seconds_per_drafted_step is None
    # a baseline that ran only in the other mode still pairs
    alone = summarize({"lik": arm}, ["exact"], fallback={"target-only": base}, fallback_name="throughput")
    assert alone["lik"].paired.over == "target-only (throughput)" and alone["lik"].paired.lost == 1


def _step(author, draft=(0, 0.0), target=(0, 0.0), judge_seconds=0.0, accepted=None, kept=0):
    return {"index": 0, "text": "", "author": author, "num_draft_tokens": draft[0], "draft_seconds": draft[1],
            "num_target_tokens": target[0], "target_seconds": target[1], "judge_seconds": judge_seconds,
            "accepted": accepted, "num_kept_tokens": kept}


def test_phase_profile_splits_the_wall_time_by_author_and_counts_the_thrown_away_draft():
    """The docstring's example: a 60-token opening by the target (5 s), a drafted step of 40 tokens
    (2 s) judged in 0.5 s and cut after 30, the target's 12 tokens after the cut (1.5 s); 10 s wall."""
    steps = [_step("target", target=(60, 5.0)),
             _step("target", draft=(40, 2.0), target=(12, 1.5), judge_seconds=0.5, accepted=False, kept=30)]
    p = phase_profile([_record(0, True, seconds=10.0, judge_seconds=0.5, steps=steps)])
    assert p.seconds == {"draft": 2.0, "target": 6.5, "verify": 0.5, "other": 1.0}
    assert p.share == {"draft": 0.2, "target": 0.65, "verify": 0.05, "other": 0.1}
    assert p.tokens == {"draft": 40, "target": 72, "verify": 40}
    assert p.tokens_per_second["draft"] == 20.0 and p.num_wasted_draft_tokens == 10


def _results(strategies, options, problem_ids=(), baseline=None):
    """A results file's reading of a run of these arms (no sessions)."""
    arms = {a: {"strategy": options.get(a, {}).get("strategy", a)} for a in strategies}
    return Results.model_validate({"config": {"strategies": strategies, "strategy_options": options},
                                   "status": "complete", "baseline": baseline,
                                   "run": {"metrics": ["exact"], "problem_ids": list(problem_ids), "arms": arms}})


def test_the_ceiling_is_draft_only_and_each_arm_reads_as_a_share_of_it():
    assert share_of_ceiling(2.5, 2.5) == pytest.approx(1.0)
    assert share_of_ceiling(1.3, 2.5) == pytest.approx((1 - 1 / 1.3) / 0.6)  # 38%
    assert share_of_ceiling(0.8, 2.5) < 0 and share_of_ceiling(1.3, 1.0) is None
    results = _results(["target-only", "fast", "sr"], {"fast": {"strategy": "draft-only"},
                                                        "sr": {"strategy": "specreason"}}, [0, 1], "target-only")
    latency = {"target-only": [_record(0, True, 5.0), _record(1, True, 5.0)],
               "fast": [_record(0, False, 2.0), _record(1, True, 2.0)],
               "sr": [_record(0, True, 4.0), _record(1, True, 4.0)]}
    lat, _ = summarize_run(results, latency, {})
    assert lat["sr"].ceiling.arm == "fast" and lat["sr"].ceiling.speedup == 2.5
    assert lat["sr"].ceiling.share == pytest.approx(share_of_ceiling(1.25, 2.5))
    assert lat["fast"].ceiling.share == pytest.approx(1.0)
    results.results = lat
    rows = {row[0]: row for row in profile_table(results)[1]}
    assert rows["sr"][:3] == ["sr", "latency", "8"] and rows["sr"][6] == "8 (100%)"  # no steps: all 'other'


def test_latency_rows_count_the_problems_every_arm_solved_and_name_the_rest():
    """A run stopped between a problem's solves: ``tree`` has #2 (wrong) and ``tree-target`` not
    yet. Both rows count #0-#1 (accuracy, p50 side by side); ``tree``'s #2 is named as unpaired."""
    results = _results(["tree", "tree-target"], {}, [0, 1, 2])
    latency = {"tree": [_record(0, True, 1.0), _record(1, True, 3.0), _record(2, False, 100.0)],
               "tree-target": [_record(0, True, 2.0), _record(1, True, 6.0)]}
    lat, _ = summarize_run(results, latency, {})
    assert lat["tree"].num_problems == 2 and lat["tree"].accuracy["exact"] == 1.0
    assert lat["tree"].seconds_p50 == 2.0 and lat["tree"].left_out == [2]
    assert lat["tree-target"].left_out == [] and lat["tree"].speedup.median == 2.0
    rows = {row[0]: row for row in table(lat, ["exact"])[1]}
    assert rows["tree"][1] == "2 (+1 unpaired)" and rows["tree-target"][1] == "2"


def test_a_search_arm_under_any_label_pairs_with_its_target_twin():
    options = {"bon-rules": {"strategy": "best-of-n"}, "sr": {"strategy": "specreason"}}
    results = _results(["bon-rules", "best-of-n-target", "tree", "sr", "target-only"], options)
    assert arm_twins(results) == {"bon-rules": "best-of-n-target"}  # tree's twin did not run: target-only then
    base = [_record(d, c, seconds=2.0) for d, c in enumerate([True, True, False])]
    arm = [_record(d, c) for d, c in enumerate([False, True, True])]
    out = summarize({"bon-rules": arm, "best-of-n-target": base, "target-only": arm}, ["exact"],
                    twins=arm_twins(results))
    assert out["bon-rules"].paired.over == "best-of-n-target"
    assert (out["bon-rules"].paired.lost, out["bon-rules"].paired.gained) == (1, 1)
    assert out["bon-rules"].speedup.median == 2.0
    # two arms of the twin's strategy: the one labelled with its name
    options["bont"] = {"strategy": "best-of-n-target"}
    results = _results(["bon-rules", "best-of-n-target", "tree", "sr", "target-only", "bont"], options)
    assert arm_twins(results)["bon-rules"] == "best-of-n-target"


def test_build_engine_passes_the_engine_settings_to_vllm(tmp_path, monkeypatch):
    import stepspec.engine.vllm_backend as backend
    from stepspec.engine.config import EnginePair, build_engine

    made = []

    class Recorder:
        def __init__(self, path, **kwargs):
            made.append(kwargs)

    monkeypatch.setattr(backend, "VLLMEngine", Recorder)
    (tmp_path / "config.json").write_text("{}")  # a model folder, as far as resolving its path goes
    for config in EnginePair(target=str(tmp_path), draft=str(tmp_path), max_num_seqs=100).engines():
        build_engine("m", config)
    assert [k["max_num_seqs"] for k in made] == [100, 100]
    assert made[0]["speculative_config"] == {"model": str(tmp_path), "num_speculative_tokens": 3}  # the pair's default
    assert made[1]["speculative_config"] == {"method": "suffix", "num_speculative_tokens": 8}  # the draft's default
    made.clear()
    for config in EnginePair(target=str(tmp_path), draft=str(tmp_path), target_spec="none",
                             draft_spec="none").engines():
        build_engine("m", config)
    assert [(k["max_num_seqs"], k["speculative_config"]) for k in made] == [(32, None), (32, None)]


@pytest.mark.vllm
def test_bench_command_on_real_vllm_survives_sigterm_and_resumes(tmp_path_factory):
    """`stepspec bench` on two tiny random models: stopped by SIGTERM after its first
    sample, the run is saved as interrupted; --resume finishes it: every problem once."""
    import os
    import signal
    import time

    from tiny_models import build_tiny_model

    target, draft = (build_tiny_model(tmp_path_factory.mktemp(f"bench{seed}"), seed=seed, weight_std=0.5,
                                      tie_word_embeddings=False) for seed in (0, 1))
    run = tmp_path_factory.mktemp("bench-run") / "run"
    cli = [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "bench"]
    common = ["--no-progress"]
    args = ["--dataset", "gsm8k", "--limit", "10", "--strategies", "target-only,specreason", "--target", str(target),
            "--draft", str(draft), "--spec", "none", "--delimiter", "ge", "--max-step-tokens", "8",
            "--max-tokens", "24", "--max-steps", "3", "--kv-cache-gib", "0.25", "--max-model-len", "512",
            "--output-dir", str(run)]
    proc = subprocess.Popen(cli + args + common, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if any(f.stat().st_size for f in run.glob("samples_*.jsonl")):
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert f"stepspecbench--resume{run}" in "".join(err.split())  # however the terminal wraps its long path
    (results_file,) = run.glob("results_*.json")
    cut = json.loads(results_file.read_text())
    assert cut["status"] == "interrupted"
    saved = sum(len(read_samples(f)) for f in run.glob("samples_*.jsonl"))
    assert 1 <= saved < 20

    r = subprocess.run(cli + ["--resume", str(run)] + common, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    done = json.loads(results_file.read_text())
    assert done["status"] == "complete" and len(done["run"]["sessions"]) == 2
    for s in ("target-only", "specreason"):
        rows = read_samples(run / f"samples_gsm8k_{s}.jsonl")
        assert sorted(r.doc_id for r in rows) == list(range(10))
        assert all(r.stats.num_tokens > 0 and r.seconds > 0 for r in rows)
    assert done["results"]["specreason"]["num_problems"] == 10
    assert done["results"]["specreason"]["num_judge_calls_mean"] > 0
    assert 0 <= done["overhead"]["run_share"] < 1
    assert "target-only" in r.stdout and "specreason" in r.stdout  # the result table
    assert (run / "report.md").exists() and all((run / p).exists() for p in PLOTS)


def test_each_arm_runs_on_the_target_engine_its_strategy_asks_for():
    """target_spec auto: target-only's target decodes with the draft model drafting its tokens,
    specreason's verifies with suffix decoding: two target engines, one draft; draft-only asks no
    target. One method for all arms: one target engine."""
    configs, roles = BenchSettings(strategies=("target-only", "specreason", "draft-only")).arm_engines()
    assert roles == {"target-only": ("target (draft)", None), "specreason": ("target (suffix)", "draft"),
                     "draft-only": (None, "draft")}
    assert configs["target (draft)"].speculation == "draft" and configs["target (draft)"].draft_model
    assert configs["target (suffix)"].speculation == "suffix" and configs["draft"].speculation == "suffix"
    configs, roles = BenchSettings(strategies=("target-only", "specreason"), target_spec="suffix").arm_engines()
    assert set(configs) == {"target", "draft"} and roles["target-only"] == ("target", None)
    # an arm's own engine setting: target-only with suffix decoding shares specreason's target
    spec = BenchSettings(strategies=("target-only", "to-suffix", "specreason"),
                     strategy_options={"to-suffix": {"strategy": "target-only", "target_spec": "suffix"}})
    configs, roles = spec.arm_engines()
    assert set(configs) == {"target (draft)", "target (suffix)", "draft"}
    assert roles["to-suffix"] == ("target (suffix)", None) and roles["specreason"][0] == "target (suffix)"
    with pytest.raises(ValueError, match="arm 'to-suffix'.*unknown speculation method 'sufix'"):
        BenchSettings(strategies=("to-suffix",), strategy_options={"to-suffix": {"strategy": "target-only",
                                                                            "target_spec": "sufix"}}).check()
    # an arm with its own draft (an aligned one beside the unaligned): a draft engine each, named by model
    spec = BenchSettings(strategies=("target-only", "specreason", "sr-aligned"),
                     strategy_options={"sr-aligned": {"strategy": "specreason", "draft": "/models/my-draft-aligned"},
                                       "target-only": {"target_spec": "suffix"}})
    configs, roles = spec.arm_engines()
    assert set(configs) == {"target", f"draft ({BUNDLED_DRAFT})", "draft (my-draft-aligned)"}
    assert roles["sr-aligned"] == ("target", "draft (my-draft-aligned)")
    assert roles["specreason"] == ("target", f"draft ({BUNDLED_DRAFT})")
    # two targets with the draft model inside, each a different draft: named by the draft inside
    spec = BenchSettings(strategies=("target-only", "to-aligned"),
                     strategy_options={"to-aligned": {"strategy": "target-only", "draft": "/models/my-draft-aligned"}})
    configs, roles = spec.arm_engines()
    assert roles["to-aligned"][0] == "target (draft: my-draft-aligned)"
    assert roles["target-only"][0] == f"target (draft: {BUNDLED_DRAFT})"
