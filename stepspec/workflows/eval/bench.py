"""``stepspec bench``: strategies side by side on the same problems, measured, not computed.

One run starts one pair of engines and gives every *arm* the same problems,
prompts, budgets and seed. An arm is a strategy under a label: a label that is
a strategy name is that strategy; any other label names its strategy in its
options (``strategy_options[label]["strategy"]``), so one strategy can run
several times with different options (``sr-score``: specreason with the score
judge, ``sr-lik``: specreason with the likelihood judge).

Two modes, measured separately:

* ``latency``: one problem at a time. Problems are interleaved: for each
  problem every arm solves it in turn, the order rotating from problem to
  problem, so drift of a shared machine hits all arms alike. Both engines'
  prefix caches are reset before every solve. Wall clock is measured around
  each solve. ``latency_limit`` keeps the first N problems, ``latency_strategies``
  the arms that run in this mode.
* ``throughput``: for each arm in turn, both prefix caches are reset and all
  the problems are solved concurrently by one reasoner (its goodput governor
  sees the load); the arm's wall time, from the first request to the last
  answer, is the measurement. ``throughput_wave`` splits the problems into
  *waves* of that many at once: every arm solves a wave in turn (the order
  rotating from wave to wave) before the next wave starts, and an arm's wall
  time is the sum of its waves'. A wave is resumed as a unit (one cut short
  runs again from scratch), and a speedup pairs only waves that one session
  timed for both arms. Worked example: 100 problems in waves of 25 and a run
  stopped in wave 3 keeps waves 1 and 2 of every arm; resumed the next day, it
  runs wave 3 again for the arms that had not finished it, then wave 4. Without
  waves the whole arm is the unit, and an arm timed on another day than the
  baseline gets no speedup (the same solves can take twice as long in another
  session of "the same" machine).

A run directory holds (lm-evaluation-harness style)::

    results_<timestamp>.json                      config, versions, git hash, metrics with standard
                                                  errors, throughput arms' wall times
    samples_<dataset>_<label>.jsonl               latency: one line per problem, appended and flushed
                                                  as it finishes
    samples_<dataset>_<label>_throughput.jsonl    throughput: the same, in the order problems finish
    report.md, *.png                              tables and plots (`stepspec bench report RUN_DIR`
                                                  rebuilds them)

``resume=True`` continues a run from its samples files: every (problem, arm)
of latency mode already there is skipped, every throughput arm with all its
problems saved is skipped. Ctrl-C leaves the files valid and the run
resumable; the results file then says ``"status": "interrupted"``. A resume
may run only some of the run's modes (``modes``); the run is then
``"incomplete"`` until a resume runs the rest. Each sample names the session
that solved it, and per-problem speedups pair solves of one session.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field

from stepspec.common.states import Author
from stepspec.common.names import did_you_mean
from stepspec.common.options import checked
from stepspec.common.yaml_files import parse_yaml
from stepspec.engine.config import EngineConfig, EnginePair
from stepspec.engine.protocol import Engine
from stepspec.orchestrator.config import ReasonerConfig, RunSettings
from stepspec.orchestrator.reasoner import Reasoner, check_reasoner
from stepspec.orchestrator.strategies import STRATEGIES, get_strategy

logger = logging.getLogger(__name__)

BASELINE = "target-only"
Mode = Literal["latency", "throughput"]
# An arm's label names its samples files: letters, digits and - _ . +
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def _role_names(role: str, configs: list[EngineConfig]) -> list[str]:
    """A name per config of one role (equal configs, one name): the role alone when all are
    one engine, else the role and what tells them apart: a target's token method (and the
    model drafting inside it when two share the method), a draft's model; a number if still equal."""
    distinct = list(dict.fromkeys(configs))
    if len(distinct) <= 1:
        return [role] * len(configs)

    def method(c: EngineConfig) -> str:
        return getattr(c, "speculation", None) or "none"

    def tell(c: EngineConfig) -> str:
        if role == Author.DRAFT:
            return f"draft ({Path(str(getattr(c, 'model', ''))).name})"
        if sum(method(d) == method(c) for d in distinct) > 1:
            return f"target ({method(c)}: {Path(str(getattr(c, 'draft_model', None) or '')).name or 'none'})"
        return f"target ({method(c)})"

    names = [tell(c) for c in distinct]
    names = [n if names.count(n) == 1 else f"{n} #{names[:k].count(n) + 1}" for k, n in enumerate(names)]
    return [names[distinct.index(c)] for c in configs]


class BenchSettings(RunSettings):
    """What a benchmark run is: data, arms, and the models, budgets and delimiter every arm
    shares (:class:`stepspec.orchestrator.config.RunSettings`); saved in its results file."""

    dataset: str = Field("gsm8k", description="gsm8k, aime24, aime25, math500, a JSONL file, or "
                         "agent-shop (generated tasks an agent solves with tools, through the serve app).")
    data_dir: str | None = Field(None, description="Folder with the benchmark JSONL files (default: "
                                 "$STEPSPEC_DATA_DIR, then ../shared/data).")
    source: Literal["local", "hub"] = Field("local", description="local files, or hub (Hugging Face, needs internet "
                                            "and `datasets`).")
    question_field: str | None = Field(None, description="JSONL field holding the question.")
    answer_field: str | None = Field(None, description="JSONL field holding the reference answer.")
    grader: str | None = Field(None, description="gsm8k, aime, math or numeric (default: the dataset's).")
    skip_bad_lines: bool = Field(False, description="Skip malformed data lines (listed in the results) instead of "
                                 "stopping.")
    offset: int = Field(0, ge=0, description="Skip this many problems first.")
    limit: int | None = Field(None, ge=1, description="At most this many problems.")
    sample: int | None = Field(None, ge=1, description="A random sample of this many problems (seeded).")
    seed: int = Field(0, description="Seed of the sample.")
    strategies: tuple[str, ...] = Field(("target-only", "specreason", "lookahead"), description="Arms: strategy "
                                        "names, or labels of arms whose strategy is given by --opt "
                                        "LABEL.strategy=NAME (one strategy with different options).")
    # Per arm: Reasoner keywords (judge, judge_options, gamma, first_target_steps, ...) and,
    # for a label that is not a strategy name, "strategy".
    strategy_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    modes: tuple[Mode, ...] = Field(("latency",), description="latency (one problem at a time, arms interleaved), "
                                    "throughput (per arm, all problems at once; its wall time) or both (throughput "
                                    "first).")
    latency_limit: int | None = Field(None, ge=1, description="Latency mode: only the first N selected problems.")
    latency_strategies: tuple[str, ...] | None = Field(None, description="Latency mode: only these arms (default "
                                                       "all).")
    throughput_wave: int | None = Field(None, ge=1, description="Throughput mode: the problems in waves of this "
                                        "many at once, every arm a wave in turn before the next; a finished wave is "
                                        "kept when the run resumes (default: one wave of all the problems).")
    # max_num_seqs (RunSettings) is raised to the problems of a throughput wave.

    def strategy_of(self, label: str) -> str:
        """The strategy an arm runs (a label that is a strategy name is that strategy)."""
        return self.strategy_options.get(label, {}).get("strategy", label)

    def latency_arms(self) -> tuple[str, ...]:
        if "latency" not in self.modes:
            return ()
        return self.strategies if self.latency_strategies is None else self.latency_strategies

    def throughput_arms(self) -> tuple[str, ...]:
        return self.strategies if "throughput" in self.modes else ()

    def check(self) -> dict[str, Reasoner]:
        """Arms and modes: anything wrong is one clear error, before any model is prepared.
        Returns each arm's reasoner checked on stand-in engines (:func:`check_reasoner`; the
        models are checked by :func:`run_bench`, after the data)."""
        names = ", ".join(STRATEGIES)
        if not self.strategies:
            raise ValueError("no strategies to bench; give --strategies")
        for label in self.strategies:
            options = self.strategy_options.get(label, {})
            if "strategy" in options:
                strategy = options["strategy"]
                if not isinstance(strategy, str):
                    raise ValueError(f"arm '{label}': its strategy must be a strategy name, got {strategy!r}")
                get_strategy(strategy)  # unknown: the error names the close ones
                if label in STRATEGIES and strategy != label:
                    raise ValueError(f"'{label}' is the name of a strategy; label the arm running '{strategy}' "
                                     "otherwise (e.g. --opt my-arm.strategy=...)")
            elif label not in STRATEGIES:
                raise ValueError(f"unknown strategy '{label}'.{did_you_mean(label, STRATEGIES)} Strategies: {names}. To bench an arm under "
                                 f"this label, give its strategy: --opt {label}.strategy=NAME")
            if not LABEL.fullmatch(label) or label.endswith("_throughput"):
                raise ValueError(f"arm label '{label}' names files: use letters, digits and - _ . + (not ending "
                                 "in _throughput)")
        if len(set(self.strategies)) != len(self.strategies):
            raise ValueError(f"a strategy is listed twice: {','.join(self.strategies)}")
        unknown = set(self.strategy_options) - set(self.strategies)
        if unknown:
            raise ValueError(f"options given for strategies not in the run: {', '.join(sorted(unknown))}")
        if not self.modes or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes must be latency, throughput or both, each once; got {self.modes}")
        if "throughput" not in self.modes and self.throughput_wave is not None:
            raise ValueError("--throughput-wave applies to throughput mode, which is not in this run (--mode "
                             "throughput or both)")
        if "latency" not in self.modes and (self.latency_limit is not None or self.latency_strategies is not None):
            raise ValueError("--latency-limit and --latency-strategies apply to latency mode, which is not in this "
                             "run (--mode latency or both)")
        if self.latency_strategies is not None:
            missing = [s for s in self.latency_strategies if s not in self.strategies]
            if missing:
                raise ValueError(f"--latency-strategies: {', '.join(missing)} not in --strategies "
                                 f"({','.join(self.strategies)})")
            if not self.latency_strategies or len(set(self.latency_strategies)) != len(self.latency_strategies):
                raise ValueError(f"--latency-strategies must name arms, each once; got "
                                 f"{','.join(self.latency_strategies)!r}")

        configs = {label: self.arm_config(label) for label in self.strategies}  # each names its arm
        return {label: self._named(label, lambda: check_reasoner(configs[label], models=False))
                for label in self.strategies}

    def arm_config(self, label: str, max_concurrency: int | None = None) -> ReasonerConfig:
        """The reasoner an arm runs: the run's engines, budget and delimiter, the arm's options
        (an engine setting among them, e.g. ``target_spec``, is the arm's own: its own engine)."""
        options = dict(self.strategy_options.get(label, {}))
        strategy = options.pop("strategy", label)
        engine = {key: options.pop(key) for key in list(options) if key in EnginePair.model_fields}
        if max_concurrency is not None:
            options["max_concurrency"] = max_concurrency

        def config() -> ReasonerConfig:
            own = checked(RunSettings, "engine settings",
                          **{**self.model_dump(include=set(RunSettings.model_fields)), **engine})
            return own.reasoner_config(strategy=strategy, **options)
        return self._named(label, config)

    def arm_engines(self) -> tuple[dict[str, EngineConfig], dict[str, tuple[str | None, str | None]]]:
        """The engines the run needs, by role, and each arm's (target role, draft role): one
        engine per distinct config the arms ask of each role (``target_spec`` auto: each
        strategy's own method; an arm's own ``draft``: its own draft engine), named "target"
        and "draft" when there is one, else by what tells them apart: "target (METHOD)",
        "draft (MODEL)". An arm whose strategy never asks the target or the draft gets none."""
        wanted = {label: (get_strategy(self.strategy_of(label)), self.arm_config(label)) for label in self.strategies}
        targets = [c.target for strategy, c in wanted.values() if strategy.needs_target]
        drafts = [c.draft for strategy, c in wanted.values() if strategy.needs_draft and c.draft is not None]
        target_names, draft_names = _role_names("target", targets), _role_names("draft", drafts)
        configs: dict[str, EngineConfig] = {}
        roles: dict[str, tuple[str | None, str | None]] = {}
        for label, (strategy, c) in wanted.items():
            target = draft = None
            if strategy.needs_target:
                target = target_names[targets.index(c.target)]
                configs[target] = c.target
            if strategy.needs_draft and c.draft is not None:
                draft = draft_names[drafts.index(c.draft)]
                configs[draft] = c.draft
            roles[label] = (target, draft)
        return configs, roles

    def reasoners(self, engines: Mapping[str, tuple[Engine | None, Engine | None]],
                  arms: tuple[str, ...] | None = None, max_concurrency: int = 8) -> dict[str, Reasoner]:
        """One reasoner per arm over the shared engines (``engines``: each arm's target and draft)."""
        return {label: Reasoner.from_config(self.arm_config(label, max_concurrency), engines=engines[label])
                for label in (self.strategies if arms is None else arms)}

    def _named(self, label: str, make: Any) -> Any:
        """``make()``, an error naming the arm when its label is not its strategy."""
        strategy = self.strategy_of(label)
        try:
            return make()
        except ValueError as e:
            if label == strategy:
                raise
            message = f"arm '{label}' ({strategy}): {e}"
            try:
                named = type(e)(message)  # the same kind of error (JudgeError, StrategyError, ...)
            except Exception:
                named = ValueError(message)
            raise named from e


def load_bench_config(path: str | Path) -> tuple[BenchSettings, str | None]:
    """A bench config file (``stepspec bench --config FILE``): a past or planned run's settings as
    YAML, ``BenchSettings``'s fields as keys (the flags' names with underscores: ``strategies``,
    ``strategy_options``, ``modes``, ...) and ``output_dir``; checked as ``stepspec bench`` checks
    its flags. Returns the spec and the output directory (None: not given).

    Example::

        dataset: gsm8k
        limit: 30
        modes: [latency]
        strategies: [target-only, specreason, sr-loose]
        strategy_options: {sr-loose: {strategy: specreason, judge_options: {floor: -8}}}
        output_dir: runs/loose
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such bench config file")
    _, data = parse_yaml(path, path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a bench config is a mapping of `stepspec bench` settings (dataset:, strategies:, "
                         f"...), not {'an empty file' if data is None else 'a ' + type(data).__name__}")
    output_dir = data.pop("output_dir", None)
    spec = checked(BenchSettings, f"bench config {path}", **data)
    spec.check()
    return spec, output_dir
