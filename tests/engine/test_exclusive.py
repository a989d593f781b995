"""Engines taking turns: calls to one engine overlap (they batch), calls to two never do."""

import asyncio

from stepspec.engine.exclusive import TurnTaking
from stepspec.engine.types import GenerationRequest
from fake_engine import ScriptedEngine


class Slow(ScriptedEngine):
    def __init__(self, name, log):
        super().__init__(name, continuation=lambda p: "ok")
        self.log = log

    async def generate(self, requests):
        self.log.append((self.name, "start"))
        await asyncio.sleep(0.02)
        self.log.append((self.name, "end"))
        return await super().generate(requests)


def test_two_engines_never_compute_at_once_but_one_engine_batches():
    log = []
    turns = TurnTaking()
    draft, target = turns.wrap(Slow("draft", log)), turns.wrap(Slow("target", log))
    request = [GenerationRequest("q")]

    async def problem(first, second):
        for _ in range(3):
            await first.generate(request)
            await second.generate(request)

    async def main():
        await asyncio.gather(problem(draft, target), problem(draft, target), problem(target, draft))

    asyncio.run(main())
    running: dict[str, int] = {"draft": 0, "target": 0}
    most = {"draft": 0, "target": 0}
    for name, event in log:
        running[name] += 1 if event == "start" else -1
        assert not (running["draft"] and running["target"]), log  # never both at once
        most[name] = max(most[name], running[name])
    assert most["draft"] >= 2 or most["target"] >= 2  # calls to one engine ran together
    assert len(log) == 2 * 18 and 2 <= turns.num_turns < 18
