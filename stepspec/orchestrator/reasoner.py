"""The Python API: a :class:`Reasoner` is two engines, a strategy and a judge.

    from stepspec.orchestrator.reasoner import Reasoner

    with Reasoner.from_models(strategy="specreason") as r:
        solution = r.solve("Janet's ducks lay 16 eggs per day. ...")
        print(solution.answer, solution.stats["step_acceptance_rate"])
        many = r.solve_many(questions)  # concurrent: the engines batch the problems

``Reasoner.from_config(ReasonerConfig(...))`` is the same from a declared configuration
(:mod:`stepspec.orchestrator.config`), which every entry point builds. ``asolve``/``asolve_many``
are the same in async code. The engines start once, on first use, and serve every
problem until ``close()``. vLLM's async engines belong to the event loop they started
on: use one Reasoner either from sync code (``solve``, which keeps its own loop) or from
one event loop (``asolve``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from stepspec.common.states import Author
from stepspec.engine.config import EngineConfig, EnginePair, build_engines, check_engine
from stepspec.engine.protocol import Engine
from stepspec.engine.speculation import TokenMethod
from stepspec.judges.base import Judge, JudgeError
from stepspec.judges.registry import make_judge
from stepspec.orchestrator.config import ReasonerConfig, engines_for
from stepspec.orchestrator.goodput import GoodputGovernor
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.run import ReasoningError
from stepspec.orchestrator.steps import StepRules
from stepspec.orchestrator.strategies import StrategyError, check_options, get_strategy
from stepspec.orchestrator.trace import StepRecord, Trace
from stepspec.orchestrator.verify_queue import JudgeQueue
from stepspec.routers.base import Router, RouterError
from stepspec.routers.registry import make_router

if TYPE_CHECKING:
    from stepspec.engine.models import PrepareProgress

# Hears an engine start: (role, engine, started): False as it begins, True once it is up.
EngineStartListener = Callable[[str, Engine, bool], None]

logger = logging.getLogger(__name__)

_PAIR = EnginePair.model_fields  # from_models' defaults: the pair's, declared once
_STRATEGY = ReasonerConfig.model_fields["strategy"].default


@dataclass(frozen=True)
class Solution:
    question: str
    trace: Trace

    @property
    def answer(self) -> str | None:
        return self.trace.answer

    @property
    def error(self) -> str | None:
        """Why the trace stopped early (an engine failure); its steps so far are kept."""
        return self.trace.error

    @property
    def stats(self) -> dict[str, Any]:
        return self.trace.stats()


class _NotLoaded:
    """Stands in for an engine while a configuration is checked; any use is a bug."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        raise RuntimeError(f"engine '{self.name}' is not loaded (configuration check only)")


def check_reasoner(config: ReasonerConfig, *, models: bool = True) -> "Reasoner":
    """Raise what :meth:`Reasoner.from_config` would for ``config`` before it builds an engine
    (an unknown strategy, judge, router or option name with the closest valid one, a bad
    option value, a strategy that needs a draft without one; then, with ``models``, an
    unknown model), loading and preparing nothing (a router file is read). Returns the
    reasoner built on stand-in engines: its judge, router and options are what they would
    be; it cannot solve."""
    clash = sorted(set(config.options) & set(ReasonerConfig.model_fields))
    if clash:
        raise StrategyError(f"{', '.join(clash)} is not a strategy option; give it as the reasoner's own key "
                            f"({clash[0]}: ...), not under options")
    checked = Reasoner(_NotLoaded(Author.TARGET), _NotLoaded(Author.DRAFT) if config.draft else None, **_keywords(config))
    for engine in _engines_in_config(config).values() if models else ():
        check_engine(engine)
    return checked


def _keywords(config: ReasonerConfig) -> dict[str, Any]:
    """``Reasoner``'s keywords for a config (engines aside)."""
    return dict(strategy=config.strategy, judge=config.judge, judge_options=config.judge_options,
                router=config.router, router_options=config.router_options,
                rules=StepRules(delimiter=config.delimiter), budget=config.budget,
                max_concurrency=config.max_concurrency, **config.options)


def _engines_in_config(config: ReasonerConfig) -> dict[str, EngineConfig]:
    """The engines a config's strategy uses, by role (the draft only where it drafts steps)."""
    drafts = get_strategy(config.strategy).needs_draft and config.draft is not None
    return {Author.TARGET: config.target, **({Author.DRAFT: config.draft} if drafts else {})}


class Reasoner:
    """Answers questions with ``strategy`` over a ``target`` and (most strategies) a ``draft``.

    ``judge`` is a judge name (default: the strategy's, built on the target
    engine with ``judge_options``) or a :class:`stepspec.judges.base.Judge`; ``router``
    (strategies that route, ``arbitrage``) is "threshold", a router file or a
    :class:`stepspec.routers.base.Router`, with ``router_options``; strategy options
    (``first_target_steps``, ``gamma``, ``cues``, ...) are keywords.
    """

    def __init__(self, target: Engine, draft: Engine | None = None, *, strategy: str = "specreason",
                 judge: str | Judge | None = None, judge_options: dict[str, Any] | None = None,
                 router: str | Router | None = None, router_options: dict[str, Any] | None = None,
                 rules: StepRules = StepRules(), budget: Budget = Budget(), max_concurrency: int = 8,
                 **strategy_options: Any) -> None:
        self.strategy = get_strategy(strategy)
        check_options(self.strategy, strategy_options)
        if self.strategy.needs_draft and draft is None:
            raise StrategyError(f"strategy '{strategy}' needs a draft engine; pass draft=... or use 'target-only'")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.target, self.draft = target, draft
        self.rules, self.budget = rules, budget
        self.options = strategy_options
        self.max_concurrency = max_concurrency
        self.judge = self._build_judge(judge, dict(judge_options or {}))
        if self.judge is not None and self.judge.needs_target_step and not self.strategy.judge_sees_target_step:
            raise JudgeError(f"{strategy} cannot use judge '{self.judge.name}': it compares with the target's "
                             f"step, which {strategy} does not write for every drafted step; use 'score' "
                             "(or the 'lookahead' strategy)")
        self.router = self._build_router(router, dict(router_options or {}))
        # Strategies that back off under load share one governor across this reasoner's problems.
        self.governor = GoodputGovernor() if self.strategy.backs_off else None
        self._runner: asyncio.Runner | None = None
        self._owned: list[Engine] = []  # engines from_config built: closed with the reasoner

    def _build_judge(self, judge: str | Judge | None, options: dict[str, Any]) -> Judge | None:
        if self.strategy.default_judge is None:
            if judge is not None or options:
                raise JudgeError(f"strategy '{self.strategy.name}' takes no judge")
            return None
        if judge is None or isinstance(judge, str):
            name = judge or self.strategy.default_judge
            if name == "score":
                options.setdefault("step_delimiter", self.rules.delimiter)
            built = make_judge(name, engine=self.target, **options)
        elif options:
            raise JudgeError("judge_options apply to a judge given by name, not to a judge object")
        else:
            built = judge
        # one queue for every problem this reasoner solves: their judge requests batch together
        return JudgeQueue(built) if self.strategy.queued_judge else built

    def _build_router(self, router: str | Router | None, options: dict[str, Any]) -> Router | None:
        if not self.strategy.needs_router:
            if router is not None or options:
                raise RouterError(f"strategy '{self.strategy.name}' takes no router (routers drive 'arbitrage')")
            return None
        if router is None:
            raise RouterError(f"strategy '{self.strategy.name}' needs a router: router='threshold' or the path of "
                              "a router file from `stepspec router train`")
        return make_router(router, **options)

    @classmethod
    def from_config(cls, config: ReasonerConfig, *, engines: tuple[Engine, Engine | None] | None = None,
                    on_prepare: PrepareProgress | None = None) -> "Reasoner":
        """The reasoner a :class:`stepspec.orchestrator.config.ReasonerConfig` describes. The config is
        checked first (:func:`check_reasoner`), before any model is prepared; then the engines
        its strategy uses are built (:func:`stepspec.engine.config.build_engines`: not started, closed
        with the reasoner; a server that does not answer fails in seconds, before a bundled
        model is prepared; ``on_prepare`` hears that progress). ``engines``: (target, draft)
        already built, shared with other reasoners (bench arms, a workflow's reasoners), used
        as they are (the config's engine settings aside) and not closed with this one."""
        owned: list[Engine] = []
        if engines is None:
            check_reasoner(config)
            wanted = _engines_in_config(config)
            built = build_engines(wanted, names={role: c.model for role, c in wanted.items()}, on_prepare=on_prepare)
            engines, owned = (built[Author.TARGET], built.get(Author.DRAFT)), list(built.values())
        reasoner = cls(engines[0], engines[1], **_keywords(config))
        reasoner._owned = owned
        return reasoner

    @classmethod
    def from_models(cls, target: str = _PAIR[Author.TARGET].default, draft: str | None = _PAIR[Author.DRAFT].default, *,
                    target_spec: TokenMethod | str = _PAIR["target_spec"].default,
                    draft_spec: TokenMethod = _PAIR["draft_spec"].default,
                    target_dtype: str = _PAIR["target_dtype"].default, draft_dtype: str = _PAIR["draft_dtype"].default,
                    num_speculative_tokens: int | None = None, kv_cache_gib: float = _PAIR["kv_cache_gib"].default,
                    max_model_len: int = _PAIR["max_model_len"].default, on_prepare: PrepareProgress | None = None,
                    **options: Any) -> "Reasoner":
        """A reasoner over in-process vLLM engines for model presets, folders or hub ids: a
        thin builder of a :class:`stepspec.orchestrator.config.ReasonerConfig` for :meth:`from_config`.

        ``target_spec``/``draft_spec``: token-level speculation inside each engine (none,
        ngram, suffix, draft). ``target_spec`` defaults to ``auto``, as on the command line:
        the strategy's own method (``draft``, the draft model drafting the target's tokens, for
        ``target-only``; ``suffix`` for ``specreason``, whose target mostly verifies; none for
        ``draft`` when ``draft`` is None). ``target_dtype``/``draft_dtype``: what each engine computes in (``auto``: the
        fastest on this machine, measured: :mod:`stepspec.engine.dtype`). ``options``: ``Reasoner``'s keywords (strategy, judge and router by name
        or file, their options, budget, max_concurrency, strategy options); of ``rules``,
        the delimiter goes into the config and the rest applies on top."""
        rules = options.pop("rules", None)
        pair = EnginePair(target=target, draft=draft, target_spec=target_spec, draft_spec=draft_spec,
                          target_dtype=target_dtype, draft_dtype=draft_dtype,
                          num_speculative_tokens=num_speculative_tokens, kv_cache_gib=kv_cache_gib,
                          max_model_len=max_model_len)
        target_config, draft_config = engines_for(pair, options.get("strategy", _STRATEGY))
        config = ReasonerConfig.from_keywords(target=target_config, draft=draft_config, **options,
                                              **({} if rules is None else {"delimiter": rules.delimiter}))
        reasoner = cls.from_config(config, on_prepare=on_prepare)
        if rules is not None:
            reasoner.rules = rules
        return reasoner

    # -- async API -----------------------------------------------------------------

    def engines_in_use(self) -> dict[str, Engine]:
        """The engines the strategy uses, by role: the target (unless the strategy never asks
        it, ``draft-only``) and the draft (strategies that draft steps)."""
        roles = {Author.TARGET: self.target} if self.strategy.needs_target else {}
        if self.strategy.needs_draft and self.draft is not None:
            roles[Author.DRAFT] = self.draft
        return roles

    async def start(self, on_engine: EngineStartListener | None = None) -> None:
        """Start the engines in use (model load; once): solving starts them when needed.
        ``on_engine(role, engine, started)`` hears each start begin and end."""
        for role, engine in self.engines_in_use().items():
            if on_engine is not None:
                on_engine(role, engine, False)
            await engine.start()
            if on_engine is not None:
                on_engine(role, engine, True)

    async def asolve(self, question: str, on_step: Callable[[StepRecord], None] | None = None, *,
                     rules: StepRules | None = None, draft: Engine | None = None) -> Solution:
        """One problem. Raises :class:`ReasoningError` (with the trace so far) if an engine fails.

        ``question`` may be a :class:`stepspec.orchestrator.prompts.Chat` (a whole conversation
        to continue). ``rules`` and ``draft`` replace the reasoner's for this call: an
        agent passes rules where a tool call ends the trace, and a draft engine that
        watches the drafted steps (a wrapper of the reasoner's own)."""
        await self.start()
        kwargs: dict[str, Any] = dict(target=self.target, rules=rules or self.rules, budget=self.budget,
                                      on_step=on_step, **self.options)
        if self.strategy.needs_draft:
            kwargs[Author.DRAFT] = draft or self.draft
        if self.judge is not None:
            kwargs["judge"] = self.judge
        if self.router is not None:
            kwargs["router"] = self.router
        if self.governor is not None:
            kwargs["governor"] = self.governor
        return Solution(question, await self.strategy.run(question, **kwargs))

    async def asolve_many(self, questions: Sequence[str],
                          on_step: Callable[[int, StepRecord], None] | None = None) -> list[Solution]:
        """Many problems at once (at most ``max_concurrency`` in flight), so the engines
        batch their steps. A problem whose engine call fails comes back with ``error``
        set and its steps so far; the others are unaffected."""
        for i, q in enumerate(questions):
            if not q or not q.strip():
                raise ValueError(f"question {i} is empty; give the problem text to reason about")
        await self.start()
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(i: int, q: str) -> Solution:
            async with gate:
                try:
                    return await self.asolve(q, None if on_step is None else (lambda rec: on_step(i, rec)))
                except ReasoningError as e:
                    logger.error("problem %d failed after %d steps: %s", i, len(e.trace.steps), e)
                    return Solution(q, e.trace)

        return list(await asyncio.gather(*(one(i, q) for i, q in enumerate(questions))))

    async def aclose(self) -> None:
        await asyncio.gather(*(engine.close() for engine in self._owned))

    async def __aenter__(self) -> "Reasoner":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # -- sync API (its own event loop, kept for the reasoner's life) ------------------

    def run_sync(self, coro):
        """Run ``coro`` on this reasoner's own event loop (the sync API's; kept for its life):
        for callers that wrap the async API, like :class:`stepspec.workflows.agents.agent.Agent`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("Reasoner.solve/solve_many run their own event loop; inside async code "
                               "use `await reasoner.asolve(...)` / `asolve_many(...)`")
        if self._runner is None:
            self._runner = asyncio.Runner()
        return self._runner.run(coro)

    def load(self, on_engine: EngineStartListener | None = None) -> None:
        """Start the engines now (sync API); otherwise the first solve does."""
        self.run_sync(self.start(on_engine))

    def solve(self, question: str, on_step: Callable[[StepRecord], None] | None = None) -> Solution:
        return self.run_sync(self.asolve(question, on_step))

    def solve_many(self, questions: Sequence[str],
                   on_step: Callable[[int, StepRecord], None] | None = None) -> list[Solution]:
        return self.run_sync(self.asolve_many(questions, on_step))

    def close(self) -> None:
        if self._runner is not None:
            self._runner.run(self.aclose())
            self._runner.close()
            self._runner = None
        elif self._owned:
            asyncio.run(self.aclose())

    def __enter__(self) -> "Reasoner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
