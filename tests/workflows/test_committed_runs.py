"""The committed bench runs (benchmarks/measured): every one still loads, and its report
regenerates from its files to the committed report.md byte for byte, so the results format
and the report stay readable as the code moves (regenerate with `stepspec bench report DIR`
when a report's wording changes); the README's headline table is the one they give. The
only tests that read committed runs; the others make their own small ones."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepspec.orchestrator.trace import Author, StopReason, Trace
from stepspec.workflows.eval.report import write_report
from stepspec.workflows.eval.results import SCHEMA_VERSION
from stepspec.workflows.eval.summary import PLOTS

MEASURED = Path(__file__).resolve().parents[2] / "benchmarks" / "measured"
SAMPLES = sorted(MEASURED.glob("**/samples_*.jsonl"))  # bench runs' samples files
RUNS = sorted(d.name for d in MEASURED.iterdir() if d.is_dir() and any(d.glob("results_*.json")))


def test_the_committed_runs_are_found():
    assert len(RUNS) >= 15 and "gsm8k100_speed_2026-12-03b_cpu" in RUNS


@pytest.mark.parametrize("run", RUNS)
def test_a_committed_runs_report_regenerates_identically(run, tmp_path):
    copy = tmp_path / run
    shutil.copytree(MEASURED / run, copy, ignore=shutil.ignore_patterns("*.png", "report.md"))
    write_report(copy)
    assert (copy / "report.md").read_text() == (MEASURED / run / "report.md").read_text()


def rebuilt_report(measured: str, tmp_path) -> tuple[Path, str]:
    """A committed run under benchmarks/measured/, copied, its report and plots deleted and rebuilt by the CLI."""
    run = tmp_path / measured
    shutil.copytree(MEASURED / measured, run)
    for f in ["report.md", *PLOTS]:
        (run / f).unlink()
    r = subprocess.run([sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "bench", "report", str(run)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return run, (run / "report.md").read_text()


def test_the_committed_best_of_n_pilot_pairs_its_labelled_arm_with_the_twin(tmp_path):
    _, report = rebuilt_report("gsm8k_offset100_bon_rules_pilot_cpu", tmp_path)
    row = "| bon-rules | throughput | 10 | 60.0% ± 16.3% | 0 / 0 / net 0 (vs best-of-n-target) | 446 | 0.81× |"
    assert row in report


def test_report_of_a_committed_run_rebuilds(tmp_path):
    run, report = rebuilt_report("gsm8k30_cpu", tmp_path)
    assert "| specreason | 30 | 20.0% ± 7.4% | 20.0% | 63.2 | 90.5 | 4.67 | 1.18× | 1.19× |" in report
    # paired: target-only solves 18; specreason loses 13 of them and gains 1
    assert "| specreason | latency | 30 | 20.0% ± 7.4% | 13 / 1 / net loss 12 |" in report
    assert "* `specreason`: `specreason`; judge `score`" in report  # told by its steps (the default then)
    assert all((run / p).stat().st_size > 1000 for p in PLOTS)


def test_the_headline_table_is_built_from_the_runs_it_names_and_the_readmes_is_current(tmp_path):
    from stepspec.workflows.eval.report import HEADLINE, update_headline

    shutil.copytree(MEASURED / "gsm8k30_cpu",
                    tmp_path / "runs" / "gsm8k30_cpu")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- headline: runs/gsm8k30_cpu -->\nold table\n<!-- /headline -->\nrest\n")
    assert update_headline(readme) and not update_headline(readme)  # built, then already current
    text = readme.read_text()
    assert "old table" not in text and text.endswith("<!-- /headline -->\nrest\n")
    assert "From [gsm8k30_cpu](runs/gsm8k30_cpu/report.md)" in text
    assert "| specreason | one at a time (30 problems) | 6/30 | 18/30: net loss 12 (lost 13, gained 1) |" in text
    readme.write_text("no block")
    with pytest.raises(ValueError, match="no '<!-- headline"):
        update_headline(readme)
    # the README's own table is the one its committed runs give
    root = Path(__file__).resolve().parents[2]
    block = HEADLINE.search((root / "README.md").read_text())
    assert block is not None, "README.md has no headline block"
    from stepspec.workflows.eval.report import headline_table
    assert block["table"] == headline_table([root / d for d in block["runs"].split()], root=root)


def _records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def test_committed_bench_samples_load_and_serialize_back():
    """Every trace a committed bench run saved (``sample_record``'s "trace", in the results
    schema this code reads) loads, and written again it is the same JSON; its stats are the
    ones the run recorded."""
    assert len(SAMPLES) >= 20
    num_traces = 0
    for path in SAMPLES:
        for record in _records(path):
            assert record["schema_version"] == SCHEMA_VERSION, path
            saved = record["trace"]
            trace = Trace.from_json(json.dumps(saved))
            assert json.loads(trace.to_json()) == saved, path
            assert Trace.from_json(trace.to_json()) == trace
            num_traces += 1
            stats = json.loads(json.dumps(trace.stats()))
            if record.get("agent"):  # an agent task's trace chains its turns: their calls are the turns' own
                turns = [t["tool_call_steps"] for t in record["agent"]["turns"]]
                assert record["stats"].pop("tool_call_steps") == {k: sum(t.get(k, 0) for t in turns)
                                                                  for k in {k for t in turns for k in t}}, path
            assert {k: stats[k] for k in record["stats"] if k in stats} == {
                k: v for k, v in record["stats"].items() if k in stats}, path
            assert isinstance(trace.stop_reason, StopReason) and all(isinstance(s.author, Author) for s in trace.steps)
    assert num_traces >= 6000


def test_every_committed_tree_search_loads_as_a_graph():
    """Each tree search a committed bench run saved (any run, either arm, either mode) loads
    as a graph whose chosen nodes are the trace's steps, in order."""
    from stepspec.orchestrator.tree import load_tree

    searches = [r for path in SAMPLES for r in _records(path) if r["strategy"] in ("tree", "tree-target")]
    assert len(searches) >= 200
    for record in searches:
        trace = Trace.from_json(json.dumps(record["trace"]))
        g = load_tree(trace)
        chosen = [n for n in g.nodes if g.nodes[n].get("chosen")]
        where = (record["strategy"], record["doc_id"])
        assert [g.nodes[n]["text"] for n in chosen] == [s.text for s in trace.steps], where


def test_the_committed_cost_model_rebuilds_and_predicts_a_run_it_was_not_fitted_on_within_10_percent():
    from stepspec.workflows.eval.cost_report import CostRuns, cost_report, markdown

    fit = [MEASURED / "gsm8k100_speed_2026-12-05_cpu", MEASURED / "lead_gsm8k100-129_cpu"]
    check = [MEASURED / "opening_aligned_gsm8k100-129_cpu", MEASURED / "target_spec_gsm8k100-149_cpu",
             MEASURED / "levers_gsm8k100-129_cpu"]
    runs = CostRuns.read(fit, check)
    assert markdown(cost_report(runs)) == (MEASURED / "cost_model_cpu" / "report.md").read_text()
    for run in ("opening_aligned_gsm8k100-129_cpu", "levers_gsm8k100-129_cpu"):
        for arm in runs.checked[run].values():
            assert abs(arm.predicted(runs.profile) / arm.measured - 1) < 0.10, (run, arm.arm)
