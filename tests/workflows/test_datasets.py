"""Datasets: named sets from the shared data folder, JSONL files with a field mapping,
malformed lines, selection, and the hub source."""

import json
import sys
import types

import pytest

from stepspec.workflows.eval.datasets import DATA_ENV, DatasetError, load_dataset, select


@pytest.mark.parametrize("name, count, grader", [
    ("gsm8k", 1319, "gsm8k"), ("aime24", 30, "aime"), ("aime25", 30, "aime"), ("math500", 500, "math"),
])
def test_named_datasets_load_from_the_shared_folder(name, count, grader):
    data = load_dataset(name)
    assert len(data.problems) == count and data.grader == grader and not data.skipped
    first = data.problems[0]
    assert first.index == 0 and first.question and first.reference
    assert "Please reason step by step" not in first.question  # the files' own instruction is stripped


def test_every_named_reference_is_gradable():
    from stepspec.workflows.eval.graders import get_grader

    for name in ("gsm8k", "aime24", "aime25"):
        data = load_dataset(name)
        grader = get_grader(data.grader)
        assert all(grader.gold(p.reference) for p in data.problems)


def test_data_dir_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "gsm8k_test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    data = load_dataset("gsm8k")
    assert [p.question for p in data.problems] == ["1+1?"] and data.source == str(tmp_path / "gsm8k_test.jsonl")


def write(path, *lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_jsonl_file_with_a_field_mapping(tmp_path):
    path = write(tmp_path / "mine.jsonl", json.dumps({"prompt": "What is 6 * 7?", "target": 42}),
                 "", json.dumps({"prompt": "What is 1 + 1?", "target": "2"}))
    data = load_dataset(str(path), question_field="prompt", answer_field="target")
    assert data.name == "mine" and data.grader == "numeric"
    assert [(p.index, p.question, p.reference) for p in data.problems] == [(0, "What is 6 * 7?", "42"),
                                                                           (1, "What is 1 + 1?", "2")]
    with pytest.raises(DatasetError, match=r"mine.jsonl:1: malformed line \(KeyError: 'question'\).*--question-field"):
        load_dataset(str(path))


@pytest.mark.parametrize("bad, why", [
    ('{"question": "q", "answer": "1"', "JSONDecodeError"),
    ('["q", "1"]', "not an object"),
    ('{"question": "", "answer": "1"}', "empty or not text"),
    ('{"question": "q", "answer": null}', "not a single answer"),
    ('{"question": "q"}', "KeyError: 'answer'"),
])
def test_a_malformed_line_is_named_by_its_number(tmp_path, bad, why):
    good = json.dumps({"question": "What is 1 + 1?", "answer": "2"})
    path = write(tmp_path / "d.jsonl", good, good, bad, good)
    with pytest.raises(DatasetError, match=rf"d.jsonl:3: malformed line \(.*{why}.*--skip-bad-lines"):
        load_dataset(str(path))
    data = load_dataset(str(path), skip_bad_lines=True)
    assert len(data.problems) == 3 and [n for n, _ in data.skipped] == [3]
    assert why in data.skipped[0][1]


def test_missing_or_unknown_datasets(tmp_path):
    with pytest.raises(DatasetError, match="unknown dataset 'gsm9k'"):
        load_dataset("gsm9k")
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DatasetError, match="no problems"):
        load_dataset(str(write(tmp_path / "empty.jsonl", "")))


def test_select_offset_limit_and_a_seeded_sample():
    problems = load_dataset("gsm8k").problems
    assert [p.index for p in select(problems, offset=10, limit=3)] == [10, 11, 12]
    a = select(problems, sample=5, seed=1)
    assert [p.index for p in a] == [p.index for p in select(problems, sample=5, seed=1)]
    assert [p.index for p in a] != [p.index for p in select(problems, sample=5, seed=2)]
    assert [p.index for p in a] == sorted(p.index for p in a)
    assert len(select(problems, sample=5, seed=1, limit=2)) == 2
    with pytest.raises(DatasetError, match="more than the"):
        select(problems[:3], sample=4)


def test_hub_source_through_the_datasets_package(monkeypatch):
    calls = []

    def fake_load_dataset(path, config, split):
        calls.append((path, config, split))
        return [{"question": "Q1", "answer": "x #### 3"}, {"question": "Q2", "answer": "#### 4"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset))
    data = load_dataset("gsm8k", source="hub")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert data.source == "hf://openai/gsm8k/test" and [p.question for p in data.problems] == ["Q1", "Q2"]

    def offline(*args, **kwargs):
        raise ConnectionError("no internet")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(DatasetError, match="could not load openai/gsm8k.*no internet.*--data-dir"):
        load_dataset("gsm8k", source="hub")


def test_agent_shop_tasks_are_generated_the_same_every_time_and_graded_numerically():
    from stepspec.workflows.eval.agent_tasks import shop_task

    dataset = load_dataset("agent-shop")
    assert dataset.grader == "numeric" and len(dataset.problems) == 200
    assert load_dataset("agent-shop").problems == dataset.problems  # a resume sees the same tasks
    for problem in dataset.problems[:20]:
        task = shop_task(problem.index)
        assert problem.question == task.question and "get_price" in task.question
        assert all(item in task.question for item in task.quantities)
        assert problem.reference == str(sum(task.prices[i] * n for i, n in task.quantities.items()))
        item = next(iter(task.prices))
        assert task.price(item.upper() + "s") == f"One {item} costs ${task.prices[item]}."
    assert "No item called 'spaceship'" in shop_task(0).price("spaceship")
    assert len({p.question for p in dataset.problems}) == 200
    with pytest.raises(DatasetError, match="'agent-shop' is generated here"):
        load_dataset("agent-shop", grader="gsm8k")
