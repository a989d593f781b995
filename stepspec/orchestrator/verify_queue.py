"""Scheduled verification: every judge request goes through one queue, drained in batches.

Tree search asks the judge about many candidate steps from many branches, and
a batch run (``solve_many``) from many problems at once. Sent one by one, the
target would judge a few prompts at a time and wait on the slowest branch.
:class:`JudgeQueue` is a judge (same protocol) that collects requests from
everyone: while one batch is with the target, new requests wait; when it
returns, everything waiting goes out as the next batch (up to ``max_batch``).
The target is busy as long as anything is pending, and no caller waits for
another caller's branch to finish drafting.

Stats (:class:`QueueStats`): batches sent, candidates judged, batch sizes and
the time each candidate waited in the queue before its batch started.

Worked example: branches A and B each send 3 candidates at t=0; both go out
as one batch of 6. Branch C sends 3 at t=0.2 while that batch runs; they go
out at t=1.0 (waited 0.8 s) with D's 3 that arrived at t=0.9: a batch of 6.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Sequence

from stepspec.judges.base import Judge, StepCandidate, Verdict


@dataclass
class QueueStats:
    num_batches: int = 0
    num_candidates: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    wait_seconds: list[float] = field(default_factory=list)  # per candidate: enqueued -> its batch started

    def observe_batch(self, size: int, waits: Sequence[float]) -> None:
        self.num_batches += 1
        self.num_candidates += size
        self.batch_sizes.append(size)
        self.wait_seconds.extend(waits)

    def to_dict(self) -> dict:
        waits = sorted(self.wait_seconds)
        return {"num_batches": self.num_batches, "num_candidates": self.num_candidates,
                "mean_batch_size": self.num_candidates / self.num_batches if self.num_batches else None,
                "max_batch_size": max(self.batch_sizes, default=None),
                "wait_seconds_p50": waits[len(waits) // 2] if waits else None,
                "wait_seconds_max": waits[-1] if waits else None}


class JudgeQueue:
    """A judge that batches the requests of all its callers into calls of ``judge``."""

    def __init__(self, judge: Judge, max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.inner = judge
        self.name = judge.name
        self.needs_target_step = judge.needs_target_step
        self.needs_draft_tokens = judge.needs_draft_tokens
        self.draft_top_k = judge.draft_top_k
        self.max_batch = max_batch
        self.stats = QueueStats()
        self._pending: list[tuple[StepCandidate, float, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        loop = asyncio.get_running_loop()
        futures = []
        for c in candidates:
            f = loop.create_future()
            self._pending.append((c, time.perf_counter(), f))
            futures.append(f)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        return list(await asyncio.gather(*futures))

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let callers of this same moment join the first batch
        while self._pending:
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            now = time.perf_counter()
            self.stats.observe_batch(len(batch), [now - t for _, t, _ in batch])
            try:
                verdicts = await self.inner.judge([c for c, _, _ in batch])
            except Exception as e:  # every waiting caller gets the failure
                for _, _, f in batch:
                    if not f.done():
                        f.set_exception(e)
                continue
            for (_, _, f), v in zip(batch, verdicts):
                if not f.done():
                    f.set_result(v)
