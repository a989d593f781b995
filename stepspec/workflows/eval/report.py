"""A benchmark run's report: report.md's tables and text, and the README's headline table,
from the run's files alone (the metrics they show: :mod:`stepspec.workflows.eval.summary`)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from statistics import fmean

from stepspec.common.states import Author, RunStatus
from stepspec.common.counts import summed

from stepspec.workflows.eval.plots import write_plots
from stepspec.workflows.eval.results import ArmSummary, Paired, Profile, Results, RunConfig
from stepspec.workflows.eval.summary import (CEILING, MODES, PHASES, Records, arm_judges, arm_strategy, arm_twins, compared_with,
                                    paired_counts, recompute, shared_problems)

def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _share(x: float | None) -> str:
    """A small share with two significant digits (0.0017%, 1.2%)."""
    return "-" if x is None else f"{x * 100:.2g}%"


def _num_problems(m: ArmSummary) -> str:
    """A row's problem count, with the solves it leaves out (latency: problems not every arm has solved)."""
    return f"{m.num_problems} (+{len(m.left_out)} unpaired)" if m.left_out else str(m.num_problems)


def table(summary: dict[str, ArmSummary], metrics: tuple[str, ...] | list[str]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the result table (shared by the terminal and report.md)."""
    primary, others = metrics[0], list(metrics[1:])
    header = (["arm", "n", f"accuracy ({primary})"] + [f"acc ({k})" for k in others]
              + ["p50 s", "p90 s", "tok/s", "speedup median", "speedup geomean", "step acc", "target tok share",
                 "token acc (target)", "orchestration"])
    rows = []
    for strategy, m in summary.items():
        target_tokens = m.token_level.get(Author.TARGET)
        rows.append([
            strategy, _num_problems(m), _accuracy(m, primary), *[_fmt(m.accuracy[k], ".1%") for k in others],
            _fmt(m.seconds_p50, ".1f"), _fmt(m.seconds_p90, ".1f"), _fmt(m.output_tokens_per_second, ".2f"),
            _fmt(m.speedup.median, ".2f", "×") + (f" (vs {m.speedup.over})" if m.speedup.over
                                                  not in (None, "target-only") else ""),
            _fmt(m.speedup.geomean, ".2f", "×"),
            _fmt(m.step_acceptance_rate, ".0%"), _fmt(m.target_token_share, ".0%"),
            "-" if target_tokens is None else
            f"{target_tokens.acceptance_rate:.2f} ({target_tokens.mean_acceptance_length:.2f}/pass)",
            _share(m.orchestration_share),
        ])
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _accuracy(m: ArmSummary, metric: str) -> str:
    acc, se = m.accuracy[metric], m.accuracy_stderr[metric]
    return "-" if acc is None else f"{acc:.1%}" + ("" if se is None else f" ± {se:.1%}")


def _vs(arm: str, m: ArmSummary, baseline: str | None) -> str:
    """An arm's lost / gained / net against the arm it is compared with."""
    paired = m.paired
    if paired is None:
        return "-"
    if is_baseline(arm, paired):
        return "baseline"
    return (f"{paired.lost} / {paired.gained} / {net_words(paired.net)}"
            + (f" (vs {paired.over})" if paired.over != baseline else ""))


def is_baseline(arm: str, paired: Paired) -> bool:
    """Whether ``arm`` is the arm its pairing is against (its own baseline)."""
    return paired.over is not None and paired.over.split(" (")[0] == arm


def net_words(net: int) -> str:
    """``net`` = lost − gained in words: "net loss 5", "net gain 1", "net 0"."""
    return f"net loss {net}" if net > 0 else f"net gain {-net}" if net < 0 else "net 0"


def _speed(m: ArmSummary, mode: str) -> tuple[str, str]:
    """A row's wall time and speed: throughput, the arm's wall time and speedup (with the
    waves it covers); latency, the per-problem speedup's median and geomean."""
    if mode != "throughput":
        return "-", ("-" if m.speedup.median is None else
                     f"{m.speedup.median:.2f}× median, {m.speedup.geomean:.2f}× geomean")
    tp = m.throughput
    wall = (_seconds(tp.wall_seconds) if tp.status == RunStatus.COMPLETE else
            f"{tp.status or 'not run'} ({tp.num_solved or 0} of {tp.num_problems})")
    speed = ("not compared: timed in another session than the baseline" if tp.other_session
             else _fmt(tp.speedup, ".2f", "×"))
    if tp.speedup is not None and tp.paired_waves < tp.num_waves:
        speed += f" ({tp.paired_waves} of {tp.num_waves} waves)"
    return wall, speed


def _judge_time(arm: str, m: ArmSummary) -> str:
    judge, vs_score = m.judge_seconds_per_drafted_step, m.judge_seconds_vs_score
    return "-" if judge is None else f"{judge:.3g}" + ("" if vs_score is None or vs_score.over == arm
                                                      else f" ({vs_score.ratio:.2g}× {vs_score.over})")


def comparison_table(results: Results) -> tuple[list[str], list[list[str]]]:
    """One row per arm and mode: accuracy, paired counts against the baseline, speed,
    and what the speculation did (from a results file with both modes' summaries)."""
    header = ["arm", "mode", "n", f"accuracy ({results.primary})", f"vs {results.baseline or 'baseline'}: lost / "
              "gained / net", "wall s", "speedup", "step acc", "target tok share", "cut steps", "backoff steps",
              "judge s / drafted step"]
    with_ceiling = any(m.ceiling for mode in MODES for m in results.summary(mode).values())
    if with_ceiling:
        header.insert(7, "share of ceiling")
    rows = []
    for arm in results.config.strategies:
        for mode in MODES:
            m = results.summary(mode).get(arm)
            if m is None or (mode == "throughput" and m.throughput.status is None and not m.num_problems):
                continue  # not run in this mode yet
            cut, drafted, ceiling = m.num_cut_steps, m.num_drafted_steps, m.ceiling
            rows.append([
                arm, mode, _num_problems(m), _accuracy(m, results.primary), _vs(arm, m, results.baseline),
                *_speed(m, mode),
                *([] if not with_ceiling else ["-" if not ceiling or ceiling.share is None else
                                               f"{ceiling.share:.0%} of {ceiling.speedup:.2f}×"]),
                _fmt(m.step_acceptance_rate, ".0%"), _fmt(m.target_token_share, ".0%"),
                "-" if cut is None or not drafted else f"{cut} ({cut / drafted:.0%})",
                _fmt(m.num_backoff_steps, "d"), _judge_time(arm, m),
            ])
    return header, rows


def profile_table(results: Results) -> tuple[list[str], list[list[str]]]:
    """One row per arm and mode: seconds per phase with their shares of the wall time, each
    author's tokens per second (:func:`phase_profile`), and the overhead (:func:`overhead`)."""
    header = ["arm", "mode", "wall s", "draft writing", "target writing", "verification", "other",
              "draft tok/s", "target tok/s", "verified tok/s", "drafted tokens thrown away", "ideal s",
              f"overhead s (of {results.baseline or 'the baseline'}'s time)"]
    rows = []
    ceiling = next((arm for arm in results.config.strategies if arm_strategy(arm, results) == CEILING), None)
    for arm in results.config.strategies:
        for mode in MODES:
            m = results.summary(mode).get(arm)
            if m is None or not m.num_problems:
                continue
            p = m.profile
            base = results.summary(mode).get(results.baseline or "")
            solo = results.summary(mode).get(ceiling or "")
            ideal, over = overhead(p, target_speed=base.profile.tokens_per_second[Author.TARGET] if base else None,
                                   draft_speed=solo.profile.tokens_per_second[Author.DRAFT] if solo else None)
            base_wall = base.profile.wall_seconds if base is not None and base.num_problems else 0
            share = over / base_wall if over is not None and base_wall else None
            rows.append([arm, mode, _seconds(p.wall_seconds),
                         *[f"{_seconds(p.seconds[phase])} ({_fmt(p.share[phase], '.0%')})" for phase in PHASES],
                         *[_fmt(p.tokens_per_second[phase], ".1f") for phase in (Author.DRAFT, Author.TARGET, "verify")],
                         f"{p.num_wasted_draft_tokens} of {p.tokens[Author.DRAFT]}" if p.tokens[Author.DRAFT] else "-",
                         "-" if ideal is None else _seconds(ideal),
                         "-" if over is None else f"{_seconds(over)} ({_fmt(share, '.0%')})"])
    return header, rows


def overhead(p: Profile, target_speed: float | None = None, draft_speed: float | None = None
             ) -> tuple[float | None, float | None]:
    """(ideal, overhead) seconds of an arm: the ideal is its trace's tokens each at its author's
    solo speed (kept drafted tokens at ``draft_speed``, the draft-only arm's tokens per second;
    the target's at ``target_speed``, the baseline's; either, where the run has no such arm, at
    the arm's own), what drafting and writing alone would cost; the overhead is the wall time
    past it (verification, drafted tokens thrown away, round trips, a slower token method).

    Example: 200 kept drafted tokens at 20 tok/s and 100 target tokens at 10 tok/s: ideal 20 s;
    a wall time of 26 s is 6 s of overhead, 15% of a 40 s target-only."""
    kept = p.tokens[Author.DRAFT] - p.num_wasted_draft_tokens
    parts = [(kept, draft_speed or p.tokens_per_second[Author.DRAFT]),
             (p.tokens[Author.TARGET], target_speed or p.tokens_per_second[Author.TARGET])]
    if any(n and not speed for n, speed in parts):
        return None, None
    ideal = sum(n / speed for n, speed in parts if n)
    return ideal, p.wall_seconds - ideal


def agent_table(records: dict[str, Records]) -> tuple[list[str], list[list[str]]]:
    """One row per arm and mode of an agent workload (samples with an ``agent`` loop): turns and
    tool calls per task, where a task's time goes (means over its tasks), each engine's prompt
    tokens served from the prefix cache across the turns, and the tool-call steps drafted,
    kept whole, and their drafted tokens kept."""
    header = ["arm", "mode", "tasks", "turns / task", "tool calls / task", "prompt tokens / turn", "task s",
              "requests s", "drafting s", "target writing s", "verification s", "tools s",
              "prefix cache hit (target, draft)", "tool-call steps drafted / kept / cut", "tool-call tokens kept"]
    rows = []
    for mode, by_arm in records.items():
        for arm, samples in by_arm.items():
            runs = [(r, r.agent) for r in samples if r.agent is not None]
            if not runs:
                continue

            turns = [t for _, a in runs for t in a.turns]
            calls = summed(a.tool_call_steps() for _, a in runs)
            hits = []
            for role in (Author.TARGET, Author.DRAFT):
                read = sum(a.prompt_tokens.get(role, {}).get("prompt", 0) for _, a in runs)
                cached = sum(a.prompt_tokens.get(role, {}).get("cached", 0) for _, a in runs)
                hits.append(f"{cached / read:.0%}" if read and mode == "latency" else "-")
            rows.append([arm, mode, str(len(runs)), f"{fmean([len(a.turns) for _, a in runs]):.1f}",
                         f"{fmean([a.num_tool_calls for _, a in runs]):.1f}",
                         f"{fmean([t.prompt_tokens for t in turns]):.0f}" if turns else "-",
                         f"{fmean([r.seconds for r, _ in runs]):.1f}",
                         f"{fmean([sum(t.seconds for t in a.turns) for _, a in runs]):.1f}",
                         *[f"{fmean([getattr(r.stats, k) or 0 for r, _ in runs]):.1f}"
                           for k in ("draft_seconds", "target_seconds", "judge_seconds")],
                         f"{fmean([a.tool_seconds for _, a in runs]):.3f}", " / ".join(hits),
                         f"{calls.get('drafted', 0)} / {calls.get('kept', 0)} / {calls.get('cut', 0)}",
                         f"{calls.get('kept_tokens', 0)} of {calls.get('draft_tokens', 0)}"
                         if calls.get("draft_tokens") else "-"])
    return header, rows


HEADLINE = re.compile(r"(<!-- headline: (?P<runs>[^>]*?) -->\n)(?P<table>.*?)(<!-- /headline -->)", re.S)


def headline_table(run_dirs: list[str | Path], root: Path | None = None) -> str:
    """The headline results of committed runs, one table each, for a newcomer: per strategy and
    mode, the problems solved beside target-only's on the same problems and the paired net loss
    or gain, and the speed against target-only, under a line naming the run (its report linked,
    paths relative to ``root``, the README's folder) and the CPU it ran on."""
    tables = []
    for run_dir in map(Path, run_dirs):
        results, _, _ = recompute(run_dir)
        report = (run_dir / "report.md").relative_to(root) if root else run_dir / "report.md"
        wave = results.config.throughput_wave
        modes = {"latency": "one at a time", "throughput": f"in waves of {wave} at once" if wave else "all at once"}
        rows = []
        for arm in results.config.strategies:
            for mode in MODES:
                m = results.summary(mode).get(arm)
                if m is None or not m.num_problems or m.paired is None:
                    continue
                p, n = m.paired, m.num_problems
                solved = "-" if p.accuracy is None else f"{round(p.accuracy * p.num_problems)}/{p.num_problems}"
                base = ("-" if p.baseline_accuracy is None else
                        f"{round(p.baseline_accuracy * p.num_problems)}/{p.num_problems}")
                speed = _speed(m, mode)[1]
                rows.append([arm, f"{modes[mode]} ({n} problems)", solved,
                             "the baseline" if is_baseline(arm, p) else
                             f"{base}: {net_words(p.net)} (lost {p.lost}, gained {p.gained})", speed])
        cpu = next((s.hardware.cpu for s in results.run.sessions if s.hardware.cpu), None)
        tables.append(f"From [{run_dir.name}]({report.as_posix()})" + (f", CPU: {cpu}" if cpu else "") + ".\n\n"
                      + markdown_table(["strategy", "mode", "solved", "target-only on the same problems",
                                        "speed against target-only"], rows))
    return "\n".join(tables) + "\n"


def update_headline(readme: str | Path) -> bool:
    """Rebuild the headline table between ``<!-- headline: RUN_DIR ... -->`` and
    ``<!-- /headline -->`` in ``readme`` from those runs' files; True if it changed."""
    path = Path(readme)
    text = path.read_text()
    match = HEADLINE.search(text)
    if match is None:
        raise ValueError(f"{path}: no '<!-- headline: RUN_DIR ... -->' ... '<!-- /headline -->' block to fill")
    table = headline_table([path.parent / d for d in match["runs"].split()], root=path.parent)
    new = text[:match.start("table")] + table + text[match.end("table"):]
    if new != text:
        path.write_text(new)
    return new != text


def wave_table(results: Results, throughput: Records) -> tuple[list[str], list[list[str]]]:
    """One row per throughput wave: each arm's right answers and wall time, with the session that
    timed it (numbered as the report lists them), then each arm against the arm it is compared with
    on that wave's problems: lost / gained, and the speedup where one session timed both. Example: a
    wave that ``tree`` solved 6/10 in 3567 s and ``tree-target`` 7/10 in 4512 s, both in session 7,
    reads ``6/10``, ``3567 (7)``, ``7/10``, ``4512 (7)``, ``2 / 1``, ``1.26×``."""
    primary, ids, wave = results.primary, results.run.problem_ids, results.config.throughput_wave
    arms = [arm for arm in results.config.strategies if arm in throughput]
    twins = arm_twins(results)
    compared = {arm: over for arm in arms if (over := compared_with(arm, twins, arms, results.baseline))
                not in (None, arm)}
    waves = {arm: results.run.waves(arm) for arm in arms}
    header = ["wave", "problems", *[f"{arm} {col}" for arm in arms for col in ("right", "wall s (session)")],
              *[f"{arm} vs {over}: {col}" for arm, over in compared.items() for col in ("lost / gained", "speedup")]]
    rows = []
    for i, start in enumerate(range(0, len(ids), wave)):
        docs = ids[start:start + wave]
        solved = {arm: [r for r in throughput[arm] if r.doc_id in docs] for arm in arms}
        timed = {arm: waves[arm][i] if i < len(waves[arm]) else None for arm in arms}
        contiguous = docs == list(range(docs[0], docs[-1] + 1))
        row = [str(i + 1), f"#{docs[0]}-{docs[-1]}" if contiguous else f"{len(docs)} sampled"]
        for arm in arms:
            w = timed[arm]
            right = sum(r.is_correct(primary) for r in solved[arm])
            row += [f"{right}/{len(solved[arm])}" if solved[arm] else "-",
                    "not run" if w is None else f"{w.wall_seconds:.0f} ({w.session + 1})"
                    if w.status == RunStatus.COMPLETE else w.status]
        for arm, over in compared.items():
            paired = paired_counts(solved[arm], solved[over], primary)
            mine, base = timed[arm], timed[over]
            speed = ("-" if mine is None or base is None or not mine.status == base.status == RunStatus.COMPLETE
                     else "sessions differ" if mine.session != base.session
                     else f"{base.wall_seconds / mine.wall_seconds:.2f}×")
            row += [f"{paired.lost} / {paired.gained}" if paired.num_problems else "-", speed]
        rows.append(row)
    return header, rows


def _describe_arm(arm: str, results: Results, judges: dict[str, str | None]) -> str:
    options = results.config.strategy_options.get(arm, {})
    strategy = arm_strategy(arm, results)
    judge = judges.get(arm)
    given = {k: v for k, v in options.items() if k != "strategy"}
    parts = [f"`{strategy}`"] + ([f"judge `{judge}`"] if judge else [])
    if given:
        parts.append(", ".join(f"{k}={json.dumps(v)}" for k, v in given.items()))
    info = results.run.arms.get(arm)
    if info is not None and info.target_spec:
        parts.append(f"the target's token-level speculation: {info.target_spec}")
    return f"* `{arm}`: " + "; ".join(parts)


def write_report(run_dir: str | Path) -> Path:
    """report.md and its plots, rebuilt from the run's results and samples files."""
    run_dir = Path(run_dir)
    results, latency, throughput = recompute(run_dir)
    plots = write_plots(run_dir, results, shared_problems(latency)[0], throughput)
    lines = [*_modes_text(results), *_tables(results, latency, throughput), *_setup_text(results, latency),
             *[f"![{p}]({p})" for p in plots]]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _modes_text(results: Results) -> list[str]:
    """The title, the problems, and how each mode ran."""
    config, run = results.config, results.run
    modes, num = run.modes, len(run.problem_ids)
    lines = [
        f"# stepspec bench: {config.dataset}, {', '.join(config.strategies)}",
        "",
        f"Status: **{results.status}**. {num} problems from `{run.dataset_source}` "
        f"(offset {config.offset}, limit {config.limit}, sample {config.sample}, seed {config.seed}), "
        f"graded by `{run.grader}`.",
        "",
    ]
    if "throughput" in modes and config.throughput_wave:
        lines += [f"**Throughput mode**: the {num} problems in waves of "
                  f"{config.throughput_wave}: every arm in turn (rotating order) solved a wave's problems "
                  "concurrently on one reasoner, prefix caches reset before each, before the next wave started; a "
                  "wave's wall time, first request to last answer, is measured, and an arm's is the sum of its "
                  "waves' (speedup: the baseline's wall time / the arm's, over the waves one session timed for "
                  "both).", ""]
    elif "throughput" in modes:
        lines += [f"**Throughput mode**: each arm in turn solved all {num} problems "
                  "concurrently on one reasoner, prefix caches reset before each arm; its wall time, first request "
                  "to last answer, is measured (speedup: target-only's wall time / the arm's).", ""]
    if "latency" in modes:
        lines += [f"**Latency mode**: {len(run.latency_ids)} problems, one at a time; all "
                  f"{'arms' if 'throughput' in modes else 'strategies'} ran in one process on the same engines and "
                  "hardware, interleaved problem by problem (rotating order), prefix caches reset before every "
                  "solve; a problem's speedup pairs its solves of one session. Times are wall clock, measured.", ""]
    return lines


def _tables(results: Results, latency: Records, throughput: Records) -> list[str]:
    """The comparison, the phase profile, the waves and the latency table, each with what it means."""
    config, run = results.config, results.run
    lines: list[str] = []
    comparison = comparison_table(results)
    if comparison[1]:
        lines += ["## Comparison", "", markdown_table(*comparison), "",
                  "Lost / gained / net: problems the baseline solves that the arm misses, the reverse, and lost − "
                  "gained (the same problems in the same mode). "
                  + ("Share of ceiling: of the time `draft-only` (the pair's ceiling, its speedup after 'of') saves "
                     "against the baseline, the share the arm saves, (1 − 1/speedup) / (1 − 1/ceiling), medians in "
                     "latency mode. " if any("share of ceiling" == h for h in comparison[0]) else "")
                  + "Cut steps: drafted steps cut inside (share of the "
                  "drafted steps). Backoff steps: steps the target wrote because drafting did not pay at that load. "
                  "Judge s / drafted step: the judge's time over the drafted steps, and its ratio to the `score` "
                  "judge's arm.", ""]
        judges = arm_judges(results)
        lines += ["Arms:", "", *[_describe_arm(arm, results, judges) for arm in config.strategies], ""]
    profile = profile_table(results)
    if profile[1]:
        lines += ["## Where the time goes", "", markdown_table(*profile), "",
                  "Seconds summed over each arm's traces, with their share of its wall time: the draft writing "
                  "(every drafted token, kept or not), the target writing (its own steps and the rest of a cut step), "
                  "verification (the judge's calls), and the rest (scheduling, waiting, orchestration; negative "
                  "where a strategy's calls overlap). Tokens per second of each author's own time; verified: drafted "
                  "tokens judged per second of verification. Ideal: the trace's kept drafted tokens at the draft-only "
                  "arm's tokens per second and the target's at the baseline's (an arm's own where the run has no "
                  "such arm); overhead: the wall time past the ideal, and "
                  "its share of the baseline's wall time. Under load (throughput) a trace's seconds include "
                  "waiting for the batch it shares.", ""]
    agents = agent_table({"latency": latency, "throughput": throughput})
    if agents[1]:
        lines += ["## Agent tasks", "", markdown_table(*agents), "",
                  "Each task is an agent loop through the serve app: a turn is one model request (the conversation "
                  "so far and the tools in, tool calls or the answer out). Means per task: its wall time (task s), "
                  "its requests' round trips (requests s; the rest of the task is the agent framework's loop), the "
                  "draft's and the target's writing and the verification inside them, and the tools. Prefix cache "
                  "hit: each engine's prompt tokens over the tasks served from its cache (one task at a time only; "
                  "the cache is reset before each task, so the hits are the turns sharing their conversation). "
                  "Tool-call steps: the steps holding calls that the draft wrote, kept whole, and cut or rejected; "
                  "tool-call tokens kept: their drafted tokens in the calls sent.", ""]
    if len(run.problem_ids) > (config.throughput_wave or math.inf) and any(throughput.values()):
        lines += ["## Throughput waves", "", markdown_table(*wave_table(results, throughput)), "",
                  ("Wall s (session): the wave's wall time and the session that timed it (listed below). Lost / "
                   "gained: on the wave's problems, against the arm compared with; speedup: its wall time / the "
                   "arm's, only where one session timed both."), ""]
    if any(latency.values()):
        header, rows = table(results.summary("latency"), run.metrics)
        lines += ["## Latency mode" if "throughput" in run.modes else "## Per strategy", "",
                  markdown_table(header, rows), ""]
    unpaired = {arm: m.left_out for arm, m in results.summary("latency").items() if m.left_out}
    if unpaired:
        lines += ["Latency rows count the problems every arm has solved, side by side; left out until the other "
                  "arms solve them (+N unpaired): " + "; ".join(f"`{arm}` " + ", ".join(f"#{d}" for d in docs)
                                                               for arm, docs in unpaired.items()) + ".", ""]
    return lines


def _model_text(config: RunConfig, role: str, speculation: str) -> str:
    if config.url(role):
        return f"{role} `{config.model(role)}` served at {config.url(role)}"
    method = config.spec(role)
    own = " (each arm's strategy's own, listed with the arms)" if method == "auto" else ""
    return f"{role} `{config.model(role)}` ({speculation}: {method}{own})"


def _setup_text(results: Results, latency: Records) -> list[str]:
    """Models, budget, hardware, versions, sessions, engines, orchestration overhead, skipped lines."""
    config, run = results.config, results.run
    sessions = run.sessions
    hw = sessions[-1].hardware if sessions else None
    no_reset = sorted({role for s in sessions for role, ok in s.prefix_cache_reset.items() if not ok})
    lines = [
        f"Models: {_model_text(config, 'target', 'token-level speculation')}, "
        f"{_model_text(config, 'draft', 'token-level')}. Budget: {config.max_tokens} tokens, "
        f"{config.max_step_tokens} per step, {config.max_steps} steps."
        + (f" The {' and '.join(no_reset)} engine could not reset its prefix cache (a server): it carried over "
           "between solves." if no_reset else ""),
        f"Hardware: {hw and hw.cpu_count} CPUs ({hw and hw.machine}"
        + (f", {hw.cpu}, native bf16: {', '.join(hw.bf16_flags) or 'none'}" if hw and hw.cpu else "")
        + f"), GPU: {(hw and hw.gpu) or 'none'}. "
        f"Versions: " + ", ".join(f"{k} {v}" for k, v in results.versions.items() if v and k != "platform")
        + f". Git: `{results.git_hash}`.",
        "",
        "Sessions (a resumed run has several): "
        + "; ".join(f"({i}) {s.started}: {s.num_solved} solve{'' if s.num_solved == 1 else 's'} in "
                    f"{_fmt(s.seconds, '.0f', ' s')} (engine start {_fmt(s.startup_seconds, '.0f', ' s')}"
                    + (f"; {' and '.join(s.modes)} only" if s.modes is not None and sorted(s.modes) != sorted(run.modes)
                       else "")
                    + ")" for i, s in enumerate(sessions, 1)) + ".",
        "",
    ]
    engines = sessions[-1].engines if sessions else None
    if engines:
        lines += ["Engines (last session): " + "; ".join(
            f"{role} computes in {e.get('dtype') or '?'}" + (f" ({e['dtype_reason']})" if e.get("dtype_reason") else "")
            for role, e in engines.items()) + ".", ""]
    if any(latency.values()):
        lines += ["Speedup is per problem (target-only seconds / strategy seconds), then median and geometric mean. "
                  "Orchestration is the share of wall time with no model call in flight.", ""]
    over = results.overhead
    if over is not None and over.run_share is not None:
        lines += [f"Orchestration over the whole run: {_share(over.solve_share)} of the solves' wall time; "
                  f"{_share(over.run_share)} of the problem loop's {over.loop_seconds:.0f} s, which also "
                  f"counts grading and writing samples (model calls: {over.model_seconds:.0f} s, prefix-cache "
                  f"resets: {over.reset_seconds:.1f} s).", ""]
    if run.skipped_lines:
        lines += [f"Skipped malformed data lines: {', '.join(str(n) for n, _ in run.skipped_lines)}.", ""]
    return lines
