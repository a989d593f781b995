"""One versioned results format: the reader takes only its schema; `stepspec bench migrate`
brings a run without one (version 0) to it, and its report reads the same."""

import json
import shutil
from pathlib import Path

import pytest

from stepspec.common.files import write_jsonl
from stepspec.workflows.eval.migrate import migrate_run
from stepspec.workflows.eval.report import write_report
from stepspec.workflows.eval.results import SCHEMA_VERSION
from stepspec.workflows.eval.rundir import BenchError, find_results, read_results, read_samples

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "benchmarks" / "measured"
STEP_DEFAULTS = {"cut": None, "backoff": False, "num_kept_tokens": 0}  # step fields newer than version 0


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _as_version_0(run: Path) -> None:
    """Rewrite ``run`` as files without a schema wrote it: no schema_version, no run.arms, a
    throughput arm's one wave as the arm's own fields, the judge's seconds only per step, and
    the traces without the fields added since (where at their defaults)."""
    path = find_results(run)
    results = json.loads(path.read_text())
    del results["schema_version"]
    del results["run"]["arms"]
    for entry in results["run"].get("throughput", {}).values():
        (wave,) = entry.pop("waves")
        entry.update(started=wave["started"], session=wave["session"])
    path.write_text(json.dumps(results, indent=2))
    for samples in run.glob("samples_*.jsonl"):
        lines = []
        for line in _lines(samples):
            del line["schema_version"]
            line["stats"]["judge_seconds"] = None
            trace = line["trace"]
            if trace.get("search") is None:
                trace.pop("search", None)
            for step in trace["steps"]:
                for key, default in STEP_DEFAULTS.items():
                    if step.get(key) == default:
                        del step[key]
            lines.append(line)
        write_jsonl(samples, lines)


@pytest.mark.parametrize("name", ["gsm8k30_cpu", "gsm8k_offset100_bon_rules_pilot_cpu"])  # latency; throughput
def test_the_migration_reads_a_version_0_run_as_it_is_committed(tmp_path, name):
    committed, old = tmp_path / "committed", tmp_path / "old"
    shutil.copytree(MEASURED / name, committed)
    shutil.copytree(MEASURED / name, old)
    _as_version_0(old)
    path = find_results(committed)  # what a version-0 file cannot hold: a wave's problems
    results = json.loads(path.read_text())
    for entry in results["run"].get("throughput", {}).values():
        for wave in entry["waves"]:
            wave.pop("problems")
    path.write_text(json.dumps(results, indent=2))
    with pytest.raises(BenchError, match=r"has no schema_version .*migrate the run once with "
                                         r"`stepspec bench migrate .*old`"):
        read_results(old)

    assert migrate_run(old) is True
    assert migrate_run(old) is False  # once
    assert read_results(old) == read_results(committed)
    for samples in committed.glob("samples_*.jsonl"):
        assert read_samples(old / samples.name) == read_samples(samples)
    assert write_report(old).read_text() == write_report(committed).read_text()


def test_the_reader_refuses_another_schema_naming_the_file_and_the_fix(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(MEASURED / "overhead_redesign_cpu", run)
    path = find_results(run)
    results = json.loads(path.read_text())
    path.write_text(json.dumps({**results, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(BenchError, match=rf"{path.name} \(a results file\): written in results schema "
                                         rf"{SCHEMA_VERSION + 1}, newer .* upgrade stepspec"):
        read_results(run)
    samples = next(run.glob("samples_*.jsonl"))
    lines = _lines(samples)
    lines[1]["schema_version"] = 0
    write_jsonl(samples, lines)
    with pytest.raises(BenchError, match=rf"{samples.name}:2 \(a sample\) is in results schema 0; .*"
                                         r"stepspec bench migrate"):
        read_samples(samples)
