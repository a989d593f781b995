"""The lab stays out of the product: every default's evidence is named in benchmarks/DECISIONS.md
(the setting exists with that default, the run is committed), and no package module names a run
or a date."""

import enum
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "benchmarks" / "DECISIONS.md"
ROW = re.compile(r"^\| `(?P<setting>[\w.]+:[\w.\[\]-]+)` \| `(?P<default>[^`]*)` \| (?P<run>[\w.-]+) \| .+ \|$", re.M)


def _rows() -> list[dict[str, str]]:
    rows = [m.groupdict() for m in ROW.finditer(DECISIONS.read_text())]
    table = [line for line in DECISIONS.read_text().splitlines() if line.startswith("| `")]
    assert len(rows) == len(table) > 10, "a row of benchmarks/DECISIONS.md does not read as | `setting` | `default` | run | why |"
    return rows


def _default(setting: str):
    """The default a setting declares: a pydantic field's, a dataclass field's or a module constant."""
    module, _, path = setting.partition(":")
    value = importlib.import_module(module)
    *owners, name = re.split(r"\.(?![^\[]*\])", path)
    for part in owners:
        key = re.fullmatch(r"(\w+)\[([\w-]+)\]", part)
        value = getattr(value, key[1])[key[2]] if key else getattr(value, part)
    fields = getattr(value, "model_fields", None)
    if fields is not None and name in fields:
        return fields[name].default
    return getattr(value, name)


def _shown(value) -> str:
    return f"{type(value).__name__}.{value.name}" if isinstance(value, enum.Enum) else str(value)


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["setting"])
def test_each_default_is_declared_as_written_and_its_run_is_committed(row):
    assert _shown(_default(row["setting"])) == row["default"], row["setting"]
    assert (ROOT / "benchmarks" / "measured" / row["run"] / "NOTES.md").is_file(), row["run"]


def test_no_package_module_names_a_run_or_a_date():
    runs = {p.name for p in (ROOT / "benchmarks" / "measured").iterdir() if p.is_dir()}
    date = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    found = []
    for path in sorted((ROOT / "stepspec").rglob("*")):
        if path.suffix not in (".py", ".yaml") or not path.is_file():
            continue
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {name}" for name in runs if name in text]
        found += [f"{path.relative_to(ROOT)}: {m}" for m in date.findall(text)]
        found += [f"{path.relative_to(ROOT)}: names benchmarks/" for _ in re.findall(r"\bbenchmarks/", text)[:1]]
    assert len(runs) > 20 and found == []
