"""stepspec/common/: atomic writes, tolerant JSON Lines reading, did-you-mean."""

import json

import pytest

from stepspec.common.files import JsonlError, append_jsonl, atomic_write, atomic_write_json, read_jsonl
from stepspec.common.names import closest, did_you_mean


def test_an_atomic_write_that_fails_leaves_the_old_file(tmp_path):
    path = tmp_path / "results.json"
    atomic_write_json(path, {"v": 1})

    def half_then_crash(tmp):
        tmp.write_text('{"v": ')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half_then_crash)
    assert json.loads(path.read_text()) == {"v": 1}
    atomic_write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}


def test_a_torn_last_line_is_dropped_and_repaired(tmp_path):
    path = tmp_path / "samples.jsonl"
    for i in range(3):
        append_jsonl(path, {"id": i})
    with path.open("a") as f:
        f.write('{"id": 3, "te')  # the process was killed mid-write
    read = read_jsonl(path)
    assert read.records == [{"id": 0}, {"id": 1}, {"id": 2}] and read.torn_line == 4
    assert read_jsonl(path, repair=True).torn_line == 4
    assert path.read_text() == "".join(json.dumps({"id": i}) + "\n" for i in range(3))
    assert read_jsonl(path) == read_jsonl(path, repair=True) and read_jsonl(path).torn_line is None


def test_a_malformed_line_before_the_last_is_an_error_naming_it(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"id": 0}\nnot json\n{"id": 2}\n\n')
    with pytest.raises(JsonlError) as e:
        read_jsonl(path)
    assert e.value.lineno == 2 and f"{path}:2" in str(e.value)


def test_parse_errors_count_as_malformed_and_a_missing_file_is_empty(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text('{"id": 0}\n{"other": 1}\n')
    assert read_jsonl(path, lambda r: r["id"]).records == [0]  # the last line lacks the key: torn
    assert read_jsonl(tmp_path / "missing.jsonl").records == []


def test_did_you_mean():
    assert did_you_mean("specreasn", ["specreason", "lookahead"]) == " Did you mean 'specreason'?"
    assert did_you_mean("xyz", ["specreason"]) == ""
    assert closest(3, [1, 3]) == "3"
