"""The ``stepspec`` command line: :func:`main`, and every command group loaded onto
:data:`workflows.cli.common.app` (one module each: solve, bench, router, serve, workflow, models, draft)."""

from __future__ import annotations

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
        err_console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
