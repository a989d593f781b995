"""The ``stepspec`` command line: :func:`main`, and every command group loaded onto
:data:`workflows.cli.common.app` (one module each: solve, bench, router, serve, workflow, models, draft)."""

from __future__ import annotations

from pydantic import ValidationError

# Command groups in modules of their own: importing one registers its commands on the app, in
# the order `stepspec --help` lists them.
import workflows.cli.solve  # noqa: F401,I001
import workflows.cli.bench  # noqa: F401
import workflows.cli.workflow  # noqa: F401
import workflows.cli.serve  # noqa: F401
import workflows.cli.router  # noqa: F401
import workflows.cli.models  # noqa: F401
import workflows.cli.draft  # noqa: F401
from engine.models import ModelError
from engine.protocol import EngineError
from workflows.cli.common import app, err_console
from workflows.eval.datasets import DatasetError

__all__ = ["app", "main"]


def main() -> None:
    """Console entry point: known errors become one clear message and exit code 2."""
    try:
        app()
    except (ModelError, EngineError, DatasetError, ValueError) as e:  # WorkflowError, RouterError, ToolError too
        err_console.print(f"[bold red]error:[/] {_message(e)}", highlight=False)
        raise SystemExit(2) from None


def _message(e: Exception) -> str:
    """An error in words; a setting pydantic refused: where it is and why, without its trimmings."""
    if not isinstance(e, ValidationError):
        return str(e)
    err = e.errors(include_url=False)[0]
    where = ".".join(str(x) for x in err["loc"])
    why = err["msg"].removeprefix("Value error, ")
    return f"{where}: {why}" if where else why


if __name__ == "__main__":
    main()
