"""Every committed bench run still loads, and its report regenerates from its files to the
committed report.md byte for byte: the results format and the report stay readable as
the code moves (regenerate with `stepspec bench report DIR` when a report's wording changes)."""

import shutil
from pathlib import Path

import pytest

from workflows.eval.report import write_report

MEASURED = Path(__file__).resolve().parents[2] / "benchmarks" / "measured"
RUNS = sorted(d.name for d in MEASURED.iterdir() if d.is_dir() and any(d.glob("results_*.json")))


def test_the_committed_runs_are_found():
    assert len(RUNS) >= 15 and "gsm8k100_speed_2026-12-03b_cpu" in RUNS


@pytest.mark.parametrize("run", RUNS)
def test_a_committed_runs_report_regenerates_identically(run, tmp_path):
    copy = tmp_path / run
    shutil.copytree(MEASURED / run, copy, ignore=shutil.ignore_patterns("*.png", "report.md"))
    write_report(copy)
    assert (copy / "report.md").read_text() == (MEASURED / run / "report.md").read_text()
