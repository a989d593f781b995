"""``stepspec bench cost``'s tables: fitted costs, calls per kept token, the model's validation,
and each run's traces priced on other hardware (:mod:`stepspec.workflows.eval.costmodel`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from stepspec.workflows.eval.costmodel import (ArmUsage, CostModelError, CostProfile, Op, fit, load_profiles,
                                      ratio_profile, run_usage, speedups)
from stepspec.workflows.eval.report import markdown_table

# Grid of the cost-ratio table: the draft's decode step and a prefilled token, each over the
# target's decode step; a call's fixed part in decode steps.
DRAFT_RATIOS = (0.05, 0.1, 0.2, 0.4, 0.6)
PREFILL_RATIOS = (0.01, 0.03, 0.1)
CALL_STEPS = (1.0, 5.0)

Table = tuple[list[str], list[list[str]]]


@dataclass(frozen=True)
class CostRuns:
    """The runs the model is fitted on and those it is checked on, read once."""

    fitted: dict[str, dict[str, ArmUsage]]
    checked: dict[str, dict[str, ArmUsage]]
    cpus: dict[str, str]
    profile: CostProfile

    @classmethod
    def read(cls, fit_dirs: Sequence[str | Path], check_dirs: Sequence[str | Path] = ()) -> CostRuns:
        if not fit_dirs:
            raise CostModelError("give at least one run to fit the costs on")
        runs: dict[str, dict[str, ArmUsage]] = {}
        cpus: dict[str, str] = {}
        for d in [*fit_dirs, *check_dirs]:
            results, arms = run_usage(d)
            name = Path(d).name
            runs[name] = arms
            cpus[name] = ", ".join(sorted({s.hardware.cpu or "unknown" for s in results.run.sessions})) or "unknown"
        fitted = {Path(d).name: runs[Path(d).name] for d in fit_dirs}
        checked = {Path(d).name: runs[Path(d).name] for d in check_dirs}
        machines = ", ".join(sorted({cpus[n] for n in fitted}))
        profile = fit([u for arms in fitted.values() for a in arms.values() for u in a.usages],
                      name=f"fitted ({machines})", source="fitted on " + ", ".join(fitted))
        return cls(fitted, checked, cpus, profile)

    def all_runs(self) -> dict[str, tuple[str, dict[str, ArmUsage]]]:
        return {**{n: ("fitted", a) for n, a in self.fitted.items()},
                **{n: ("not fitted", a) for n, a in self.checked.items()}}


def _s(x: float) -> str:
    return f"{x:.4f}" if x < 0.1 else f"{x:.3f}"


def costs_table(profile: CostProfile) -> Table:
    header = ["operation", "token method", "per call s", "per prefilled token s", "per decoded token s"]
    rows = [[op.value, method, _s(c.per_call), _s(c.per_prefill_token), "-" if op is Op.VERIFY else _s(c.per_decode_token)]
            for (op, method), c in sorted(profile.costs.items(), key=lambda kv: (list(Op).index(kv[0][0]), kv[0][1]))]
    return header, rows


def calls_table(runs: CostRuns) -> Table:
    """Per run and arm: engine calls per token of the final traces, and each operation's calls."""
    header = ["run", "arm", "problems", "calls per kept token", *[f"{op.value} calls" for op in Op]]
    rows = []
    for name, (_, arms) in runs.all_runs().items():
        for arm, a in arms.items():
            total = a.total()
            per_op = {op: sum(u.calls for (o, _), u in total.items() if o is op) for op in Op}
            cpk = a.calls_per_kept_token
            rows.append([name, arm, str(len(a.doc_ids)), "-" if cpk is None else f"{cpk:.4f}",
                         *[str(per_op[op]) for op in Op]])
    return header, rows


def validation_table(runs: CostRuns) -> Table:
    """Per run and arm: measured against predicted seconds, summed over its problems."""
    header = ["run", "CPU", "fitted?", "arm", "measured s", "predicted s", "error"]
    rows = []
    for name, (kind, arms) in runs.all_runs().items():
        for arm, a in arms.items():
            try:
                p = a.predicted(runs.profile)
                err = f"{(p / a.measured - 1) * 100:+.1f}%"
                shown = f"{p:.1f}"
            except CostModelError as e:
                shown, err = "-", f"not priced: {e}"
            rows.append([name, runs.cpus[name], kind, arm, f"{a.measured:.1f}", shown, err])
    return header, rows


def projection_table(arms: dict[str, ArmUsage], profiles: Sequence[CostProfile], baseline: str) -> Table:
    """Each arm's traces priced under each profile: seconds and speedup over ``baseline``."""
    if baseline not in arms:
        raise CostModelError(f"the baseline arm '{baseline}' is not among the run's arms ({', '.join(arms)}); "
                             "name one with --baseline")
    others = [a for a in arms if a != baseline]
    header = ["profile", f"{baseline} s", *[f"{a}: s, speedup (pooled / median)" for a in others]]
    rows = []
    for profile in profiles:
        try:
            base = arms[baseline].predicted(profile)
        except CostModelError:
            continue
        row = [profile.name, f"{base:.1f}"]
        for arm in others:
            try:
                pooled, median = speedups(arms[baseline], arms[arm], profile)
                row.append(f"{arms[arm].predicted(profile):.1f}: {pooled:.2f}x / {median:.2f}x")
            except CostModelError:
                row.append("-")
        rows.append(row)
    return header, rows


def sources_table(profiles: Sequence[CostProfile]) -> Table:
    return ["profile", "source", "notes"], [[p.name, p.source, p.notes] for p in profiles]


def ratio_table(arms: dict[str, ArmUsage], baseline: str, arm: str) -> Table:
    """``arm``'s predicted speedup over ``baseline`` on a grid of cost ratios (rows: the draft's
    decode step over the target's; columns: a prefilled token over a decode step, and a call's
    fixed part in decode steps)."""
    for name in (baseline, arm):
        if name not in arms:
            raise CostModelError(f"arm '{name}' is not among the run's arms ({', '.join(arms)})")
    columns = [(v, c) for c in CALL_STEPS for v in PREFILL_RATIOS]
    header = ["draft / target decode step", *[f"prefill {v:g}, call {c:g} steps" for v, c in columns]]
    rows = [[f"{d:g}", *[f"{speedups(arms[baseline], arms[arm], ratio_profile(d, v, c))[0]:.2f}x"
                         for v, c in columns]] for d in DRAFT_RATIOS]
    return header, rows


def cost_report(runs: CostRuns, baseline: str = "target-only", arm: str = "specreason",
                profiles_file: str | Path | None = None) -> list[tuple[str, Table]]:
    """The report's titled tables, in order."""
    profiles = load_profiles(profiles_file) if profiles_file else load_profiles()
    first = next(iter(runs.fitted))
    arms = runs.fitted[first]
    return [
        (f"Costs fitted on {', '.join(runs.fitted)} (one problem at a time)", costs_table(runs.profile)),
        ("Engine calls per kept token", calls_table(runs)),
        ("The model against the measured seconds", validation_table(runs)),
        (f"{first}'s traces priced on each profile (speedup over {baseline})",
         projection_table(arms, [runs.profile, *profiles], baseline)),
        ("The profiles' sources", sources_table(profiles)),
        (f"{arm}'s predicted speedup over {baseline} by cost ratio ({first}'s traces)",
         ratio_table(arms, baseline, arm)),
    ]


def markdown(report: list[tuple[str, Table]]) -> str:
    return "\n\n".join(f"## {title}\n\n{markdown_table(*table)}" for title, table in report) + "\n"
