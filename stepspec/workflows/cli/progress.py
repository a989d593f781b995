"""Progress shown while models are prepared and engines start (solve, serve, models prepare)."""

from __future__ import annotations

import contextlib

from stepspec.workflows.cli.common import console


@contextlib.contextmanager
def prepare_progress():
    """A bar per step of preparing a model (drawn only if a model needs preparing): bytes
    assembled and verified, then a spinner with elapsed time while it converts (minutes on CPU)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[size]}"),
                        TimeElapsedColumn(), console=console)
    tasks: dict[str, int] = {}

    def finish_all() -> None:
        for task in progress.tasks:
            progress.update(task.id, total=task.total or 1, completed=task.total or 1)

    def on_progress(what: str, done: int, total: int | None) -> None:
        if not tasks:
            progress.start()
        if what not in tasks:
            finish_all()  # the step before is over
            tasks[what] = progress.add_task(what, total=total, size="")
        size = "" if total is None else f"{done / 1e6:.0f}/{total / 1e6:.0f} MB"
        progress.update(tasks[what], completed=done, size=size)

    try:
        yield on_progress
        finish_all()
    finally:
        if tasks:
            progress.stop()


@contextlib.contextmanager
def engine_progress():
    """A spinner per engine while it starts (tens of seconds on CPU): what it does, elapsed time."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as progress:
        tasks: dict[str, int] = {}

        def on_engine(role: str, engine, started: bool) -> None:
            if not started:
                tasks[role] = progress.add_task(f"starting the {role} engine ({engine.name}): loading it into vLLM",
                                                total=1)
            else:
                progress.update(tasks[role], description=f"{role} engine ({engine.name}) ready", completed=1)

        yield on_engine
