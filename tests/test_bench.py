"""`stepspec bench`: side-by-side runs, result files, resume, report (scripted engines),
and one run of the command on real vLLM with tiny models."""

import asyncio
import json
import re
import subprocess
import sys

import pytest

from fake_engine import ScriptedEngine
from workflows.bench import BenchError, BenchSpec, read_samples, run_bench
from workflows.report import PLOTS, acceptance_by_position

STRATEGIES = ("target-only", "draft-only", "specreason")


def write_problems(path, n=6):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"q": f"What is {i} + 10?", "a": str(i + 10)}) + "\n")
    return path


def _question_number(prompt: str) -> int:
    """n in the prompt's question "What is n + 10?" (the warm-up asks "What is 2 + 3?")."""
    a, b = re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1]
    return int(a) + int(b) - 10


def engines():
    """The target is always right; the draft is wrong on odd problems; the judge (on the
    target) scores a drafted step 9 when its boxed number is right, else 0."""

    def target(prompt):
        return "\\boxed{%d}" % (_question_number(prompt) + 10) if "Add ten." in prompt else "Add ten.\n\n"

    def draft(prompt):
        n = _question_number(prompt)
        return "\\boxed{%d}" % (n + 10 + n % 2) if "Add ten." in prompt else "Add ten.\n\n"

    def score(prompt):
        n = _question_number(prompt)
        boxed = re.findall(r"\\boxed\{(\d+)\}", prompt)
        good = not boxed or int(boxed[-1]) == n + 10
        return [("9", 0.0)] if good else [("0", 0.0)]

    return ScriptedEngine("target", next_token=score, continuation=target), ScriptedEngine("draft", continuation=draft)


def spec_for(data, **kw):
    # the scripted target rates steps 0-9: specreason with the score judge
    kw.setdefault("strategy_options", {"specreason": {"judge": "score"}})
    return BenchSpec(dataset=str(data), question_field="q", answer_field="a", strategies=STRATEGIES, **kw)


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
          "versions", "git_hash"}


def untimed(obj):
    """A result or sample with the wall-clock fields (which differ from run to run) left out."""
    if isinstance(obj, dict):
        return {k: untimed(v) for k, v in obj.items() if k not in TIMING}
    if isinstance(obj, list):
        return [untimed(v) for v in obj]
    return obj


def test_strategies_side_by_side_write_results_samples_and_report(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 4)
    results = asyncio.run(run_bench(spec_for(data), tmp_path / "run", engines=engines()))
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
        assert [r["doc_id"] for r in rows] == [0, 1, 2, 3]
        assert {"question", "reference", "response", "answer", "correct", "trace", "seconds"} <= set(rows[0])
    # interleaved: on problem k the strategies start at position k (mod 3), so each goes first in turn
    firsts = [next(s for s in STRATEGIES if read_samples(run / f"samples_add_{s}.jsonl")[k]["position"] == 0)
              for k in range(3)]
    assert firsts == list(STRATEGIES)
    report = (run / "report.md").read_text()
    assert "| specreason | 4 | 100.0% ± 0.0%" in report
    for plot in PLOTS:
        assert (run / plot).stat().st_size > 1000
    # the run is finished: resuming it solves nothing and changes no metric
    again = asyncio.run(run_bench(spec_for(data), run, resume=True, engines=engines()))
    assert untimed(again["results"]) == untimed(results["results"])


def test_resume_after_ctrl_c_gives_the_same_results_as_an_uninterrupted_run(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 5)
    whole = asyncio.run(run_bench(spec_for(data), tmp_path / "whole", engines=engines()))

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(run_bench(spec_for(data), tmp_path / "cut", engines=engines(), progress=StopAfter(7)))
    (results_file,) = (tmp_path / "cut").glob("results_*.json")
    cut = json.loads(results_file.read_text())
    assert cut["status"] == "interrupted" and "KeyboardInterrupt" in cut["run"]["sessions"][0]["error"]
    assert sum(len(read_samples(f)) for f in (tmp_path / "cut").glob("samples_*.jsonl")) == 7
    # a later kill left half a line behind: it is dropped and that problem solved again
    with open(tmp_path / "cut" / "samples_add_specreason.jsonl", "a") as f:
        f.write('{"doc_id": 4, "strat')

    resumed = asyncio.run(run_bench(spec_for(data, limit=1), tmp_path / "cut", resume=True, engines=engines()))
    assert resumed["status"] == "complete" and len(resumed["run"]["sessions"]) == 2
    assert resumed["config"]["limit"] is None  # the run's own config, not the caller's
    assert untimed(resumed) == untimed(whole)
    for s in STRATEGIES:
        a = read_samples(tmp_path / "whole" / f"samples_add_{s}.jsonl")
        b = sorted(read_samples(tmp_path / "cut" / f"samples_add_{s}.jsonl"), key=lambda r: r["doc_id"])
        assert untimed(a) == untimed(b)


def test_a_run_directory_is_not_overwritten_and_a_broken_samples_file_is_named(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 2)
    asyncio.run(run_bench(spec_for(data), tmp_path / "run", engines=engines()))
    with pytest.raises(BenchError, match="already holds a run; resume it with --resume"):
        asyncio.run(run_bench(spec_for(data), tmp_path / "run", engines=engines()))
    path = tmp_path / "run" / "samples_add_draft-only.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0][:20] + "\n" + lines[1] + "\n")
    with pytest.raises(BenchError, match=r"samples_add_draft-only.jsonl:1: malformed sample line"):
        asyncio.run(run_bench(spec_for(data), tmp_path / "run", resume=True, engines=engines()))
    with pytest.raises(BenchError, match="holds no results"):
        asyncio.run(run_bench(spec_for(data), tmp_path / "empty", resume=True, engines=engines()))


def test_bad_specs_fail_before_any_engine_starts(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 2)
    with pytest.raises(ValueError, match="unknown strategy 'spec-reason'"):
        asyncio.run(run_bench(spec_for(data).model_copy(update={"strategies": ("spec-reason",)}), tmp_path / "r"))
    with pytest.raises(ValueError, match="options given for strategies not in the run: lookahead"):
        asyncio.run(run_bench(spec_for(data, strategy_options={"lookahead": {"gamma": 2}}), tmp_path / "r"))
    with pytest.raises(ValueError, match="extra_forbidden|Extra inputs"):
        BenchSpec(datset="gsm8k")
    assert not (tmp_path / "r").exists()


def test_report_is_rebuilt_from_the_files_by_the_cli(tmp_path):
    data = write_problems(tmp_path / "add.jsonl", 3)
    asyncio.run(run_bench(spec_for(data), tmp_path / "run", engines=engines()))
    for f in ["report.md", *PLOTS]:
        (tmp_path / "run" / f).unlink()
    r = subprocess.run([sys.executable, "-c", "from workflows.cli import main; main()", "bench", "report",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "specreason" in r.stdout and "100.0%" in r.stdout
    assert "| draft-only | 3 | 66.7% ± 33.3%" in (tmp_path / "run" / "report.md").read_text()
    assert all((tmp_path / "run" / p).exists() for p in PLOTS)
    rows = read_samples(tmp_path / "run" / "samples_add_specreason.jsonl")
    assert acceptance_by_position(rows) == [(0, 3, 3), (1, 3, 2)]


@pytest.mark.parametrize("args, message", [
    (["--strategies", "target-only,spec-reason"], "unknown strategy 'spec-reason'"),
    (["--opt", "specreason.gamma=2"], "strategy 'specreason' has no option gamma"),
    (["--opt", "lookahead.gamma=2", "--strategies", "specreason"], "strategy 'lookahead' is not in --strategies"),
    (["--opt", "gamma"], "--opt wants STRATEGY.KEY=VALUE"),
    (["--dataset", "gsm9k"], "unknown dataset 'gsm9k'"),
    (["--limit", "0"], "limit"),
    (["--grader", "exactish"], "unknown grader 'exactish'"),
])
def test_bench_cli_rejects_bad_options_before_loading_models(tmp_path, args, message):
    r = subprocess.run([sys.executable, "-c", "from workflows.cli import main; main()", "bench",
                        "--target", "/nonexistent-model", "--spec", "none", "--output-dir", str(tmp_path / "r"),
                        "--no-progress", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr


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
    cli = [sys.executable, "-c", "from workflows.cli import main; main()", "bench"]
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
    assert f"stepspec bench --resume {run}" in " ".join(err.split())
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
        assert sorted(r["doc_id"] for r in rows) == list(range(10))
        assert all(r["stats"]["num_tokens"] > 0 and r["seconds"] > 0 for r in rows)
    assert done["results"]["specreason"]["num_problems"] == 10
    assert done["results"]["specreason"]["num_judge_calls_mean"] > 0
    assert 0 <= done["overhead"]["run_share"] < 1
    assert "target-only" in r.stdout and "specreason" in r.stdout  # the result table
    assert (run / "report.md").exists() and all((run / p).exists() for p in PLOTS)
