"""The `stepspec` command line (typer) and its terminal views."""
