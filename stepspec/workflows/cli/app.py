"""The ``stepspec`` command line: :func:`main`, and every command group loaded onto
:data:`stepspec.workflows.cli.common.app` (one module each: solve, bench, router, serve, workflow, models, draft)."""

from __future__ import annotations

# Command groups in modules of their own: importing one registers its commands on the app, in
# the order `stepspec --help` lists them.
import stepspec.workflows.cli.solve  # noqa: F401,I001
import stepspec.workflows.cli.bench  # noqa: F401
import stepspec.workflows.cli.workflow  # noqa: F401
import stepspec.workflows.cli.serve  # noqa: F401
import stepspec.workflows.cli.router  # noqa: F401
import stepspec.workflows.cli.models  # noqa: F401
import stepspec.workflows.cli.draft  # noqa: F401
from stepspec.engine.models import ModelError
from stepspec.engine.protocol import EngineError
from stepspec.workflows.cli.common import app, err_console
from stepspec.workflows.eval.datasets import DatasetError

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
