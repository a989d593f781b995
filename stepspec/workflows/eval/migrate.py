"""Bring results files to the schema this stepspec reads, once (``stepspec bench migrate``).

From files without ``schema_version`` (version 0) to version 1:

* the results file: every arm in ``run.arms`` (strategy: its ``strategy`` option, else its
  label; judge: its ``judge`` option, else the one judge its steps name, else its strategy's
  default); a throughput arm timed before waves becomes its one wave (its session: the one
  that started last before it); ``schema_version: 1``;
* each samples line: ``stats.judge_seconds`` summed over the steps where the line has none;
  the trace with every field (a field the line lacks at its default); ``schema_version: 1``;
* a workflow run record (``stepspec run --record``): ``schema_version: 1``; a record written
  before runs could be resumed (no ``workflow_digest``) cannot be, and stays as it is.

A run already at version 1 is left as it is; a run is rewritten only once all its files
migrated in memory. What a report says of a run is the same before and after.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stepspec.common.files import atomic_write_json, write_jsonl
from stepspec.orchestrator.strategies import STRATEGIES
from stepspec.orchestrator.trace import Trace
from stepspec.workflows.eval.results import SCHEMA_VERSION
from stepspec.workflows.eval.rundir import BenchError, find_results


def migrate_sample(line: dict[str, Any]) -> dict[str, Any]:
    """A samples line of version 0 as version 1."""
    trace = Trace.from_dict(line["trace"])
    stats = dict(line["stats"])
    if stats.get("judge_seconds") is None:  # only per step then
        stats["judge_seconds"] = sum(step.judge_seconds for step in trace.steps)
    return {"schema_version": SCHEMA_VERSION, **line, "stats": stats, "trace": json.loads(trace.to_json())}


def arm_info(arm: str, options: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """What a version-0 run ran as ``arm`` (``samples``: its lines, either mode's)."""
    strategy = options.get("strategy", arm)
    judge = options.get("judge")
    if not isinstance(judge, str):
        names = {s["judge"] for line in samples for s in line["trace"]["steps"] if s.get("judge")}
        known = STRATEGIES.get(strategy)
        judge = next(iter(names)) if len(names) == 1 else known.default_judge if known else None
    return {"strategy": strategy, "judge": judge, "router": None,
            "options": {k: v for k, v in options.items() if k != "strategy"}, "target_spec": None}


def migrate_results(results: dict[str, Any], samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A results file of version 0 as version 1 (``samples``: each arm's lines, latency first)."""
    run, config = results["run"], results["config"]
    arms = run.setdefault("arms", {})
    for arm in config.get("strategies", []):
        options = config.get("strategy_options", {}).get(arm, {})
        if arm not in arms:
            arms[arm] = arm_info(arm, options, samples.get(arm, []))
        elif arms[arm].get("strategy") is None:
            arms[arm]["strategy"] = options.get("strategy", arm)
    started = sorted(s["started"] for s in run.get("sessions", []))
    for entry in run.get("throughput", {}).values():
        if entry.get("waves") is not None:
            continue
        session, begun = entry.pop("session", None), entry.pop("started", None)
        if entry.get("status") is None:
            entry["waves"] = []
            continue
        if session is None:  # the session that started last before the arm
            session = sum(s <= (begun or "") for s in started) - 1
        entry["waves"] = [{"status": entry["status"], "num_solved": entry.get("num_solved"),
                           "wall_seconds": entry.get("wall_seconds"), "started": begun, "session": session}]
    return {"schema_version": SCHEMA_VERSION, **results}


def migrate_run(run_dir: Path) -> bool:
    """Migrate one run in place; False where it is at this version already."""
    path = find_results(run_dir)
    results = json.loads(path.read_text())
    if results.get("schema_version") == SCHEMA_VERSION:
        return False
    if results.get("schema_version") is not None:
        raise BenchError(f"{path}: schema_version {results['schema_version']}: `stepspec bench migrate` brings "
                         f"version 0 (no schema_version) to {SCHEMA_VERSION}")
    throughput, latency = results["run"].get("throughput_samples", {}), results["run"].get("samples", {})
    lines = {name: [json.loads(line) for line in (run_dir / name).read_text().splitlines() if line.strip()]
             for name in {*throughput.values(), *latency.values()} if (run_dir / name).is_file()}
    by_arm = {**throughput, **latency}  # an arm's judge: from its latency lines where it has them
    migrated = migrate_results(results, {arm: lines.get(name, []) for arm, name in by_arm.items()})
    new_lines = {name: [migrate_sample(line) for line in rows] for name, rows in lines.items()}
    for name, rows in new_lines.items():
        write_jsonl(run_dir / name, rows)
    atomic_write_json(path, migrated)
    return True


def migrate_record(path: Path) -> bool:
    """Migrate a workflow run record in place; False where it is at this version already."""
    record = json.loads(path.read_text())
    if record.get("schema_version") == SCHEMA_VERSION:
        return False
    if "workflow_digest" not in record:
        raise BenchError(f"{path}: written before runs could be resumed (no workflow_digest): run its workflow "
                         "again without --resume")
    atomic_write_json(path, {"schema_version": SCHEMA_VERSION, **record}, default=str)
    return True
