"""The roles and states every layer names: who wrote a step, where a run stands."""

from __future__ import annotations

from enum import StrEnum


class Author(StrEnum):
    """A model's role, and who wrote a step's final text (``StepRecord.author``); engines are
    keyed by it."""

    DRAFT = "draft"  # the draft model: a drafted step kept whole (or a draft-only/search step)
    TARGET = "target"  # the target: baselines, first steps, a rewrite after a rejection or a cut

    @property
    def other(self) -> Author:
        return Author.TARGET if self is Author.DRAFT else Author.DRAFT


class RunStatus(StrEnum):
    """Where a run stands: a bench run, a throughput arm or a wave, a workflow run."""

    RUNNING = "running"  # being run now (or the process died: a resume runs it again)
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"  # a bench run stopped between waves, or with another mode's work left
    INTERRUPTED = "interrupted"  # Ctrl-C or a signal
    FAILED = "failed"  # an error (a workflow: a node failed or was skipped, or the engines did not start)
