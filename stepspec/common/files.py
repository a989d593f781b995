"""Files that survive a killed process.

* :func:`atomic_write_text` / :func:`atomic_write_json`: the file is either the old one
  or the new one, never half-written (write beside it, then rename over it).
* :func:`read_jsonl`: an append-only JSON Lines file whose last line may have been cut
  off mid-write. Worked example: a file holding ``{"id": 1}\\n{"id": 2}\\n{"id"`` reads as
  two records and one torn line; the same torn text on line 2 of 3 is an error naming
  ``file:2``, since only the last write can be cut off.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """``write(tmp)`` writes the new file beside ``path``; it then replaces ``path`` in one
    rename, so a reader sees the old file or the new one, never a part (torch.save, ...)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    tmp.replace(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_write` of ``text``."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike, data: Any, **dumps: Any) -> None:
    """:func:`atomic_write_text` of ``json.dumps(data, indent=2, **dumps)``."""
    atomic_write_text(path, json.dumps(data, indent=2, **dumps))


def append_jsonl(path: str | os.PathLike, record: Any) -> None:
    """Append one record as one line, flushed (a crash can tear only this last line)."""
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def write_jsonl(path: str | os.PathLike, records: Iterable[Any]) -> None:
    """The whole file, one record per line as :func:`append_jsonl` writes them, in one
    :func:`atomic_write` (a file rewritten without some of its records)."""
    atomic_write_text(path, "".join(json.dumps(record) + "\n" for record in records))


class JsonlError(ValueError):
    """A JSON Lines file has a malformed line that is not the last (not a torn write)."""

    def __init__(self, path: Path, lineno: int, cause: Exception) -> None:
        super().__init__(f"{path}:{lineno}: malformed line ({cause})")
        self.path, self.lineno, self.cause = path, lineno, cause


@dataclass(frozen=True)
class JsonlRead:
    """What :func:`read_jsonl` found: the records, and the line number of a torn last line (None: none)."""

    records: list[Any]
    torn_line: int | None = None


def read_jsonl(path: str | os.PathLike, parse: Callable[[Any], T] = lambda x: x, *, repair: bool = False) -> JsonlRead:
    """The records of a JSON Lines file (``parse`` applied to each; its TypeError, KeyError
    or ValueError counts as malformed). A malformed last non-blank line is a write cut off
    by a killed process: dropped (and with ``repair`` cut from the file). A malformed line
    before it raises :class:`JsonlError` with the file and line. A missing file has no records."""
    path = Path(path)
    if not path.is_file():
        return JsonlRead([])
    lines = path.read_text(encoding="utf-8").split("\n")
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    records: list[Any] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(parse(json.loads(line)))
        except (json.JSONDecodeError, TypeError, KeyError, ValueError) as e:
            if lineno != last:
                raise JsonlError(path, lineno, e) from e
            if repair:
                atomic_write_text(path, "".join(f"{x}\n" for x in lines[:lineno - 1] if x.strip()))
            return JsonlRead(records, torn_line=lineno)
    return JsonlRead(records)


def resume_record(path: str | os.PathLike, settings: Any, *, error: type[Exception], what: str,
                  fix: str = "use the same options to continue it, or another --output-dir") -> dict[str, Any]:
    """The record of a resumable run (``{"config": settings, "sessions": [...]}``) at ``path``:
    a new one, or the one there when it holds the same ``settings`` (a pydantic model); else
    ``error`` naming each setting that differs (``what``: the run, as the message calls it)."""
    record: dict[str, Any] = {"config": settings.model_dump(mode="json"), "sessions": []}
    path = Path(path)
    if not path.is_file():
        return record
    record = json.loads(path.read_text())
    try:
        saved = type(settings).model_validate(record["config"])
    except (KeyError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        raise error(f"{path}: its settings cannot be read back ({e})") from e
    if saved != settings:
        diff = ", ".join(f"{k}: {v!r} there, {getattr(settings, k)!r} now"
                         for k, v in saved.model_dump().items() if getattr(settings, k) != v)
        raise error(f"{path.parent} holds {what} with other settings ({diff}); {fix}")
    return record
