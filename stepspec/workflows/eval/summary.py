"""A benchmark run's metrics, computed from its files alone (shown by :mod:`stepspec.workflows.eval.report`).

Terms (per arm, over the run's problems; an arm is a strategy under a label,
and each mode, latency and throughput, is summarized on its own):

* accuracy ± standard error: mean of 0/1 correctness; the error is the sample
  standard error sqrt(p(1-p)/(n-1)), as lm-evaluation-harness reports it.
* wall time p50/p90: seconds per problem, measured around each solve.
* output tokens/s: tokens of the final traces over the seconds spent on them.
* speedup over the baseline: per problem, baseline seconds / strategy seconds;
  the median and the geometric mean of those ratios, over the problems one
  session of the run solved in both arms (a resumed run may see another
  machine: a problem whose two solves straddle sessions counts for accuracy,
  not speed). The baseline is
  ``target-only``, except for a search strategy whose target-only twin ran
  too (``PAIRED_BASELINES``: ``tree`` over ``tree-target``, ``best-of-n`` over
  ``best-of-n-target``: the same search, the target doing all of it), under
  any label: an arm ``bon-rules`` running ``best-of-n`` pairs with the run's
  ``best-of-n-target`` arm (:func:`arm_twins`).
* step acceptance rate: accepted drafted steps / drafted steps, pooled.
* target token share: tokens of the traces' text the target wrote / all of them.
* token-level acceptance (vLLM, per engine): accepted draft tokens / proposed
  draft tokens, and mean acceptance length = 1 + accepted / drafts (tokens per
  target forward pass). Example: 2 drafts of 3 tokens, 5 accepted: 0.83 and 3.5.
* orchestration share: (wall time − time with a model call in flight) / wall time,
  pooled: what stepspec itself costs around the models.
* paired accuracy against the baseline (the same problems, the same mode):
  ``lost`` = problems the baseline solves and the arm misses, ``gained`` = the
  reverse, ``net`` = lost − gained (positive: the arm is worse). Example: on 5
  problems target-only is right on 1, 2, 3 and the arm on 2, 3, 4: lost 1
  (problem 1), gained 1 (problem 4), net 0.
* throughput speedup: the baseline arm's wall time / the arm's, each arm solving
  all the problems concurrently, or a wave of them at a time (measured once per
  arm and wave, kept in the results file); summed over the waves one session of
  the run timed for both arms, since a resumed run's sessions need not see the
  same machine load. Example: waves 1-2 timed on Monday for both arms, wave 3 of
  the baseline on Monday and of the arm on Tuesday: the speedup is over waves 1-2
  ("2 of 3 waves").
* cut steps: drafted steps the judge cut inside (partial acceptance); backoff
  steps: steps the target wrote because the goodput governor found drafting did
  not pay at the load of the moment.
* judge seconds per drafted step: the judge's seconds summed over the traces /
  drafted steps; and its ratio to the same figure of the arm using the ``score``
  judge (in the same mode), when the run has one.
* phase profile (:func:`phase_profile`): where an arm's wall time went, summed over its
  traces: the draft writing (every drafted token, kept or not), the target writing, the
  verifier (the judge's calls: for the likelihood verifier one prefill per drafted step),
  and the rest (scheduling, waiting for the other engine's batch, orchestration); each
  author's tokens per second of its own time.
* ceiling: the pair's best case, ``draft-only``'s speedup over the baseline (the draft
  writing everything); an arm's *share of the ceiling* is the share of the time the
  ceiling saves that the arm saves: (1 − 1/s) / (1 − 1/c) for speedup s and ceiling c
  (medians in latency mode). Example: ceiling 2.5× (saves 60% of the time), an arm at
  1.3× (saves 23%): 38% of the ceiling; an arm slower than the baseline has a negative share.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from stepspec.common.states import Author, RunStatus
from stepspec.workflows.eval.results import (ArmSummary, Ceiling, Paired, Profile, Results, Sample, Speedup,
                                    ThroughputFigures, TokenLevel, VsScore)

PLOTS = ("accuracy_vs_speedup.png", "latency_cdf.png", "acceptance_by_position.png")
PAIRED_BASELINES = {"tree": "tree-target", "best-of-n": "best-of-n-target"}
MODES = ("throughput", "latency")  # the order of the report's rows
CEILING = "draft-only"  # the strategy whose speedup is the pair's ceiling
PHASES = ("draft", "target", "verify", "other")
Records = dict[str, list[Sample]]  # an arm's samples of one mode, in the run's problem order


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def paired_counts(rows: list[Sample], base_rows: list[Sample], metric: str, over: str | None = None) -> Paired:
    """An arm's correctness against the baseline's on the problems both solved:
    ``lost`` (baseline right, arm wrong), ``gained`` (the reverse), ``net`` = lost − gained."""
    base = {r.doc_id: r.is_correct(metric) for r in base_rows}
    pairs = [(base[r.doc_id], r.is_correct(metric)) for r in rows if r.doc_id in base]
    lost = sum(1 for b, a in pairs if b and not a)
    gained = sum(1 for b, a in pairs if a and not b)
    return Paired(metric=metric, num_problems=len(pairs), lost=lost, gained=gained, net=lost - gained,
                  accuracy=statistics.fmean(a for _, a in pairs) if pairs else None,
                  baseline_accuracy=statistics.fmean(b for b, _ in pairs) if pairs else None, over=over)


def _stat_total(rows: list[Sample], key: str) -> int | None:
    """A counter summed over the samples; None when the samples did not record it."""
    values = [getattr(r.stats, key) for r in rows]
    return sum(values) if values and None not in values else None


def phase_profile(rows: list[Sample]) -> Profile:
    """Where an arm's time went, over its sample records: seconds per phase (``draft``: the
    draft writing, kept or not; ``target``: the target writing; ``verify``: the judge; ``other``:
    the wall time left, scheduling and orchestration), their shares of the wall time, each
    phase's tokens and tokens per second (``verify``: drafted tokens judged), and the drafted
    tokens a cut threw away. Strategies whose calls overlap (lookahead) or whose discarded
    branches are not steps of the trace (tree, best-of-n) leave ``other`` as the remainder,
    negative where calls overlapped.

    Example: one trace of 10 s, a drafted step of 40 tokens in 2 s, judged in 0.5 s and cut
    after 30, and the target's 12 tokens after the cut in 1.5 s, plus a 60-token opening by the
    target in 5 s: draft 2 s (20 tok/s), target 6.5 s (72 tokens, 11 tok/s), verify 0.5 s (40
    tokens), other 1 s; 10 drafted tokens thrown away."""
    wall = sum(r.seconds for r in rows)
    steps = [step for r in rows for step in r.steps]
    seconds = {Author.DRAFT: sum(step.draft_seconds for step in steps),
               Author.TARGET: sum(step.target_seconds for step in steps),
               "verify": sum(r.stats.judge_seconds for r in rows)}
    seconds["other"] = wall - sum(seconds.values())
    judged = [step for step in steps if step.accepted is not None]
    tokens = {Author.DRAFT: sum(step.num_draft_tokens for step in steps),
              Author.TARGET: sum(step.num_target_tokens for step in steps),
              "verify": sum(step.num_draft_tokens for step in judged)}
    return Profile(wall_seconds=wall, seconds=seconds,
                   share={phase: _ratio(seconds[phase], wall) for phase in PHASES},
                   tokens=tokens, tokens_per_second={phase: _ratio(tokens[phase], seconds[phase]) for phase in tokens},
                   num_wasted_draft_tokens=sum(step.num_draft_tokens - step.num_kept_tokens
                                               for step in judged if not step.accepted))


def share_of_ceiling(speedup: float | None, ceiling: float | None) -> float | None:
    """The share of the time the ceiling saves that ``speedup`` saves (module docstring)."""
    if speedup is None or ceiling is None or ceiling <= 1:
        return None
    return (1 - 1 / speedup) / (1 - 1 / ceiling)


def same_session(a: Sample, b: Sample) -> bool:
    """Whether two sample records' seconds compare: one session solved both (records that
    name no session, None, pair only with each other)."""
    return a.session == b.session


def _speedup(rows: list[Sample], base: dict[int, Sample], over: str | None) -> Speedup:
    ratios = [base[r.doc_id].seconds / r.seconds for r in rows
              if r.doc_id in base and r.seconds > 0 and same_session(r, base[r.doc_id])]
    return Speedup(median=statistics.median(ratios) if ratios else None,
                   geomean=math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None,
                   num_problems=len(ratios), over=over if ratios else None)


def _token_level(rows: list[Sample]) -> dict[str, TokenLevel]:
    out = {}
    for role in sorted({k for r in rows for k in r.stats.spec_decoding}):
        counts = [r.stats.spec_decoding.get(role, {}) for r in rows]
        drafts, proposed, accepted = (sum(c.get(key, 0) for c in counts)
                                      for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"))
        if drafts:
            out[role] = TokenLevel(num_drafts=drafts, num_draft_tokens=proposed, num_accepted_tokens=accepted,
                                   acceptance_rate=_ratio(accepted, proposed),
                                   mean_acceptance_length=1 + accepted / drafts)
    return out


def _paired(rows: list[Sample], over: str | None, records: Records, fallback: Records | None,
            fallback_name: str, metric: str) -> Paired | None:
    if over in records:
        return paired_counts(rows, records[over], metric, over)
    if over and fallback and over in fallback:
        return paired_counts(rows, fallback[over], metric, f"{over} ({fallback_name})")
    return None


def arm_summary(rows: list[Sample], metrics: tuple[str, ...] | list[str], speedup: Speedup,
                paired: Paired | None) -> ArmSummary:
    """One arm's figures from its samples (the module docstring defines each)."""
    n = len(rows)
    accuracy = {k: statistics.fmean(r.is_correct(k) for r in rows) if n else None for k in metrics}
    seconds = [r.seconds for r in rows]
    stats = [r.stats for r in rows]
    num_tokens = sum(s.num_tokens for s in stats)
    drafted = sum(s.num_drafted_steps for s in stats)
    judge_seconds = sum(r.stats.judge_seconds for r in rows)
    return ArmSummary(
        num_problems=n, num_errors=sum(1 for r in rows if r.error), accuracy=accuracy,
        accuracy_stderr={k: (math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else None) if (p := accuracy[k]) is not None
                         else None for k in metrics},
        seconds_p50=float(np.percentile(seconds, 50)) if n else None,
        seconds_p90=float(np.percentile(seconds, 90)) if n else None,
        seconds_total=sum(seconds), output_tokens_per_second=_ratio(num_tokens, sum(seconds)), speedup=speedup,
        step_acceptance_rate=_ratio(sum(s.num_accepted_steps for s in stats), drafted),
        target_token_share=_ratio(sum(s.num_target_tokens for s in stats), num_tokens),
        num_tokens_mean=num_tokens / n if n else None,
        num_generated_tokens={role: sum(s.num_generated_tokens.get(role, 0) for s in stats)
                              for role in sorted({k for s in stats for k in s.num_generated_tokens})},
        num_target_calls_mean=statistics.fmean(s.num_target_calls for s in stats) if n else None,
        num_judge_calls_mean=statistics.fmean(s.num_judge_calls for s in stats) if n else None,
        token_level=_token_level(rows),
        orchestration_share=_ratio(sum(seconds) - sum(r.model_seconds for r in rows), sum(seconds)),
        stop_reasons=dict(sorted(_count(r.stop_reason for r in rows).items())), paired=paired,
        num_drafted_steps=drafted, num_cut_steps=_stat_total(rows, "num_cut_steps"),
        num_kept_draft_tokens=_stat_total(rows, "num_kept_draft_tokens"),
        num_backoff_steps=_stat_total(rows, "num_backoff_steps"), judge_seconds=judge_seconds,
        judge_seconds_per_drafted_step=_ratio(judge_seconds, drafted), profile=phase_profile(rows))


def summarize(records: Records, metrics: tuple[str, ...] | list[str], baseline: str | None = "target-only", *,
              judges: dict[str, str | None] | None = None, twins: dict[str, str] | None = None,
              fallback: Records | None = None, fallback_name: str = "other mode") -> dict[str, ArmSummary]:
    """Per arm, the run's metrics from its sample records (one mode's).

    ``judges``: arm → judge name, for the judge-time ratio to the ``score`` arm.
    ``twins``: search arm → its target-only twin's arm (default: arms named as their strategies).
    ``fallback``: the other mode's records, to pair accuracy with a baseline
    that did not run in this mode."""
    twins = PAIRED_BASELINES if twins is None else twins
    out = {}
    for strategy, rows in records.items():
        over = compared_with(strategy, twins, records, baseline)
        base = {r.doc_id: r for r in records.get(over, [])} if over else {}
        out[strategy] = arm_summary(rows, metrics, _speedup(rows, base, over),
                                    _paired(rows, over, records, fallback, fallback_name, metrics[0]))
    score_arm = next((a for a, m in out.items() if (judges or {}).get(a) == "score"
                      and m.judge_seconds_per_drafted_step), None)
    for m in out.values():
        mine = m.judge_seconds_per_drafted_step
        m.judge_seconds_vs_score = None if score_arm is None or mine is None else VsScore(
            over=score_arm, ratio=mine / out[score_arm].judge_seconds_per_drafted_step)
    return out


def arm_strategy(arm: str, results: Results) -> str:
    """The strategy an arm ran, as the run recorded it."""
    return results.run.arms[arm].strategy or arm


def arm_twins(results: Results) -> dict[str, str]:
    """Each search arm's target-only twin among the run's arms: an arm running the twin strategy
    (``PAIRED_BASELINES``), the one labelled with the twin's name first."""
    arms = results.config.strategies
    strategies = {arm: arm_strategy(arm, results) for arm in arms}
    twins = {}
    for arm in arms:
        twin = PAIRED_BASELINES.get(strategies[arm])
        candidates = [a for a in arms if twin is not None and strategies[a] == twin]
        if candidates:
            twins[arm] = twin if twin in candidates else candidates[0]
    return twins


def arm_judges(results: Results) -> dict[str, str | None]:
    """Each arm's judge, as the run recorded it (None: it takes none)."""
    return {arm: results.run.arms[arm].judge for arm in results.config.strategies}


def compared_with(arm: str, twins: dict[str, str], arms, baseline: str | None) -> str | None:
    """The arm an arm is compared with: its target-only twin when ``arms`` has it, else the baseline."""
    return twins[arm] if twins.get(arm) in arms else baseline


def shared_problems(records: Records) -> tuple[Records, dict[str, list[int]]]:
    """Latency records cut to the problems every arm with records has solved, and per arm the
    problems it solved that some other arm has not (yet). Latency interleaves the arms problem by
    problem, so a stopped run can hold a problem one arm solved and the next did not; its rows count
    the same problems side by side. Example: ``tree`` solved #0-#2, ``tree-target`` #0-#1: both rows
    count #0-#1, and ``tree``'s #2 is left out until ``tree-target`` solves it."""
    solved = [{r.doc_id for r in rows} for rows in records.values() if rows]
    shared = set.intersection(*solved) if solved else set()
    kept = {arm: [r for r in rows if r.doc_id in shared] for arm, rows in records.items()}
    return kept, {arm: [r.doc_id for r in rows if r.doc_id not in shared] for arm, rows in records.items()}


def throughput_figures(results: Results, arm: str, m: ArmSummary, over: str | None,
                       compared: bool) -> ThroughputFigures:
    """An arm's throughput wall time, and its speedup over ``over`` (``compared``: that arm ran
    in this mode) summed over the waves one session timed for both."""
    run = results.run.throughput.get(arm)
    wave, num_problems = results.config.throughput_wave, len(results.run.problem_ids)
    # Wall times are compared wave by wave, only where one session timed both arms: a
    # resumed run's sessions may run on another CPU or beside other work, and the same
    # solves, the same texts, can take twice as long.
    timed = [(a, b) for a, b in zip(results.run.waves(arm), results.run.waves(over) if compared else [])
             if a.status == b.status == RunStatus.COMPLETE]
    paired = [(a.wall_seconds, b.wall_seconds) for a, b in timed if a.session == b.session]
    mine_paired, base_paired = sum(a for a, _ in paired), sum(b for _, b in paired)
    mine = run.wall_seconds if run is not None and run.status == RunStatus.COMPLETE else None
    return ThroughputFigures(
        status=None if run is None else run.status, wall_seconds=mine,
        num_problems=None if run is None else run.num_problems, num_solved=None if run is None else run.num_solved,
        max_concurrency=None if run is None else run.max_concurrency,
        num_waves=-(-num_problems // wave) if wave else 1, paired_waves=len(paired),
        problems_per_minute=60 * m.num_problems / mine if mine else None,
        output_tokens_per_second=_ratio((m.num_tokens_mean or 0) * m.num_problems, mine or 0),
        speedup=base_paired / mine_paired if paired else None, over=over if paired else None,
        other_session=bool(timed) and not paired)


def summarize_run(results: Results, latency: Records, throughput: Records) -> tuple[dict[str, ArmSummary],
                                                                                  dict[str, ArmSummary]]:
    """Both modes' summaries of a run (``results``: its results file; the records of each
    mode per arm). A throughput arm's summary adds its measured wall time and the speedup."""
    metrics, baseline = results.run.metrics, results.baseline
    judges, twins = arm_judges(results), arm_twins(results)
    latency, left_out = shared_problems(latency)
    lat = summarize(latency, metrics, baseline, judges=judges, twins=twins, fallback=throughput,
                    fallback_name="throughput")
    for arm, m in lat.items():
        m.left_out = left_out[arm]
    tp = summarize(throughput, metrics, baseline, judges=judges, twins=twins, fallback=latency,
                   fallback_name="latency")
    for arm, m in tp.items():
        over = compared_with(arm, twins, tp, baseline)
        m.throughput = throughput_figures(results, arm, m, over, over in tp)
    ceiling_arm = next((arm for arm in results.config.strategies if arm_strategy(arm, results) == CEILING), None)
    for summary, speed in ((lat, lambda m: m.speedup.median), (tp, lambda m: m.throughput.speedup)):
        ceiling = speed(summary[ceiling_arm]) if ceiling_arm in summary else None
        for m in summary.values():
            m.ceiling = None if ceiling is None else Ceiling(arm=ceiling_arm, speedup=ceiling,
                                                             share=share_of_ceiling(speed(m), ceiling))
    return lat, tp


def _count(items) -> dict[str, int]:
    counts: dict[str, int] = {}
    for x in items:
        counts[x] = counts.get(x, 0) + 1
    return counts


def _read(run_dir: Path, files: dict[str, str], problem_ids: list[int]) -> Records:
    from stepspec.workflows.eval.rundir import read_samples

    order = {doc: i for i, doc in enumerate(problem_ids)}
    records = {}
    for arm, name in files.items():
        rows = [r for r in read_samples(run_dir / name) if r.doc_id in order]
        records[arm] = sorted(rows, key=lambda r: order[r.doc_id])
    return records


def load_run(run_dir: str | Path) -> tuple[Results, Records]:
    """A run's results file and its latency sample records per arm (in the run's problem order)."""
    from stepspec.workflows.eval.rundir import read_results

    results = read_results(Path(run_dir))
    return results, _read(Path(run_dir), results.run.samples, results.run.latency_ids)


def load_throughput(run_dir: str | Path, results: Results) -> Records:
    """A run's throughput sample records per arm (in the run's problem order)."""
    return _read(Path(run_dir), results.run.throughput_samples, results.run.problem_ids)


def recompute(run_dir: str | Path) -> tuple[Results, Records, Records]:
    """A run's results with both modes' summaries computed again from its files, and the
    records of each mode."""
    results, latency = load_run(run_dir)
    throughput = load_throughput(run_dir, results)
    results.results, results.results_throughput = summarize_run(results, latency, throughput)
    return results, latency, throughput


def acceptance_by_position(rows: list[Sample]) -> list[tuple[int, int, int]]:
    """(step position, drafted steps, accepted) over a strategy's traces."""
    drafted: dict[int, int] = {}
    accepted: dict[int, int] = {}
    for r in rows:
        for step in r.steps:
            if step.draft_text is not None:
                drafted[step.index] = drafted.get(step.index, 0) + 1
                accepted[step.index] = accepted.get(step.index, 0) + bool(step.accepted)
    return [(i, drafted[i], accepted[i]) for i in sorted(drafted)]
