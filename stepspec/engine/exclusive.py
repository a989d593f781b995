"""Engines that take turns: at most one of a group computes at a time.

On a CPU machine two vLLM engines that run at once each spin their OpenMP
threads on the same cores, and both slow down far more than twice (measured
here: collecting router data with the 0.5B and the 1.5B overlapping ran at
about 3 steps a minute). :class:`TurnTaking` wraps a group of engines so that
calls to one engine still run together (vLLM batches them) while calls to
another wait until the first engine has none in flight; the engines then
take turns, each with every core.

Worked example: problems A and B call the draft; C calls the target while
they run: C waits. A and B finish; C runs, and A's next target call joins it
in the same batch. B's next draft call waits until the target is idle.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from stepspec.engine.protocol import Engine
from stepspec.engine.types import GenerationRequest, GenerationResult, NextTokenDistribution, Prompt


class TurnTaking:
    """The shared turn: which engine holds it and how many of its calls are in flight."""

    def __init__(self) -> None:
        self._holder: int | None = None
        self._in_flight = 0
        self._changed = asyncio.Condition()
        self.num_turns = 0  # how many times the turn passed from one engine to another

    def wrap(self, engine: Engine) -> "TakingTurns":
        return TakingTurns(engine, self)

    async def _enter(self, key: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._holder in (None, key))
            if self._holder is None:
                self.num_turns += 1
            self._holder = key
            self._in_flight += 1

    async def _leave(self) -> None:
        async with self._changed:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._holder = None
                self._changed.notify_all()


class TakingTurns:
    """One engine of a :class:`TurnTaking` group; the Engine protocol, otherwise the engine's."""

    def __init__(self, engine: Engine, turns: TurnTaking) -> None:
        self.engine = engine
        self._turns = turns

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        await self._turns._enter(id(self.engine))
        try:
            return await self.engine.generate(requests)
        finally:
            await self._turns._leave()

    async def next_token_logprobs(self, prompts: Sequence[Prompt], top_k: int = 20) -> list[NextTokenDistribution]:
        await self._turns._enter(id(self.engine))
        try:
            return await self.engine.next_token_logprobs(prompts, top_k)
        finally:
            await self._turns._leave()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)
