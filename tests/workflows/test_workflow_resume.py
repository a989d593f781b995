"""A map node keeps each item as it finishes, a failed or interrupted run keeps what it
finished, and resuming its record (``WorkflowRun.run(..., resume=)``, ``stepspec run
--resume``) runs only the rest, on scripted engines and tools; at the end, the same
against a real vLLM OpenAI-compatible server killed mid-run (markers ``vllm``, ``server``)."""

import asyncio
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fake_engine import ScriptedEngine
from openai_server import free_port, stop_process, vllm_server

from stepspec.engine.openai_backend import OpenAIEngine
from stepspec.engine.protocol import EngineUnavailableError
from stepspec.engine.types import GenerationRequest, Sampling
from stepspec.workflows.flows.runner import WorkflowRun, load_record
from stepspec.workflows.flows.schema import WorkflowError, load_workflow

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()"]
ENV = {**os.environ, "COLUMNS": "300",
       "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).resolve().parent), str(ROOT / "tests" / "support")])}

QUESTIONS = ["q0", "q1", "q2", "q3"]

MAPPED = """\
engines:
  target: {backend: openai, base_url: "http://127.0.0.1:9/v1", model: m}
reasoners:
  solver: {target: target, strategy: target-only}
allowed_modules: [test_workflow_resume]
tools:
  count: {function: "test_workflow_resume:count_items"}
workflow:
  inputs:
    questions: {type: list}
  nodes:
    each: {map: "${inputs.questions}", node: {reason: solver, prompt: "${item}"}, concurrency: 1}
    total: {tool: count, args: {items: "${each.output}"}}
  outputs:
    answers: "${each.output}"
    total: "${total.output}"
"""


def count_items(items: list) -> int:
    return len(items)


class Server(ScriptedEngine):
    """Answers "\\boxed{N}" for the question "qN"; once ``alive`` is False, every call fails
    as an OpenAI engine's does when its server has died. A question in ``refuse`` fails
    on its own."""

    def __init__(self, refuse: tuple[str, ...] = ()):
        super().__init__("target", continuation=self.answer)
        self.alive = True
        self.refuse = refuse

    def answer(self, prompt: str) -> str:
        if not self.alive:
            raise EngineUnavailableError("engine 'target': the OpenAI-compatible server at http://127.0.0.1:9 "
                                         "stopped answering during the run")
        question = re.findall(r"q\d", prompt)[-1]
        if question in self.refuse:
            raise ValueError(f"{question} is not a question I take")
        return f"\\boxed{{{question[1:]}}}"

    def questions(self) -> list[str]:
        """The questions asked, in order, one per call."""
        return [re.findall(r"q\d", p)[-1] for p in self.prompts]


def _workflow(tmp_path, text=MAPPED):
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    return load_workflow(path)


def _kill_after_first_item(engine):
    def on_item(name, index, rec):
        if index == 0:
            engine.alive = False

    return on_item


def test_a_dead_engine_keeps_finished_items_and_resume_runs_only_the_rest(tmp_path):
    w = _workflow(tmp_path)
    engine = Server()
    record_path = tmp_path / "record.json"
    record = asyncio.run(WorkflowRun(w, engines={"target": engine}).run(
        {"questions": QUESTIONS}, record_path=record_path, on_item=_kill_after_first_item(engine)))
    each = record["nodes"]["each"]
    assert record["status"] == "failed" and each["status"] == "failed"
    assert each["error"].startswith("MapError: 1 of 4 items finished (1 failed, 2 not started; ")
    assert "the first error, item 1 (\"q1\")" in each["error"] and "stopped answering" in each["error"]
    items = each["details"]["items"]
    assert [i["status"] for i in items] == ["done", "failed", "skipped", "skipped"]
    assert items[0]["output"] == "0" and "not started: item 1 found its engine unavailable" in items[2]["error"]
    assert engine.questions() == ["q0", "q1"]  # items 2 and 3 never reached the dead engine
    assert record["nodes"]["total"]["status"] == "skipped" and record["outputs"] == {"answers": None, "total": None}
    saved = load_record(record_path)
    assert saved["nodes"]["each"]["details"]["items"][0] == json.loads(json.dumps(items[0]))

    fresh = Server()
    resumed = asyncio.run(WorkflowRun(w, engines={"target": fresh}).run(
        {"questions": QUESTIONS}, record_path=record_path, resume=saved))
    assert fresh.questions() == ["q1", "q2", "q3"]  # q0 was not asked again
    assert resumed["status"] == "complete" and resumed["resumed"] == 1
    assert resumed["outputs"] == {"answers": ["0", "1", "2", "3"], "total": 4}
    again = load_record(record_path)  # updated in place, the first item as the first run wrote it
    assert again["nodes"]["each"]["details"]["items"][0] == saved["nodes"]["each"]["details"]["items"][0]
    assert again["status"] == "complete"

    # a finished record resumes to itself: no engine starts, nothing is asked
    idle = Server()
    asyncio.run(WorkflowRun(w, engines={"target": idle}).run({"questions": QUESTIONS}, resume=again))
    assert idle.prompts == [] and not idle.started


def test_an_item_that_fails_on_its_own_does_not_stop_the_others(tmp_path):
    w = _workflow(tmp_path, MAPPED.replace("concurrency: 1", "concurrency: 2"))
    engine = Server(refuse=("q2",))
    record = asyncio.run(WorkflowRun(w, engines={"target": engine}).run({"questions": QUESTIONS}))
    each = record["nodes"]["each"]
    assert [i["status"] for i in each["details"]["items"]] == ["done", "done", "failed", "done"]
    assert each["error"].startswith("MapError: 3 of 4 items finished (1 failed; ")
    assert "item 2 (\"q2\"): ValueError: q2 is not a question I take" in each["error"]

    fresh = Server()
    resumed = asyncio.run(WorkflowRun(w, engines={"target": fresh}).run({"questions": QUESTIONS}, resume=record))
    assert fresh.questions() == ["q2"]
    assert resumed["outputs"]["answers"] == ["0", "1", "2", "3"]


def test_an_interrupted_run_keeps_its_finished_items(tmp_path):
    w = _workflow(tmp_path)
    record_path = tmp_path / "record.json"

    async def cut_after_first_item():
        engine = Server()
        engine.delay = 0.05
        task = asyncio.current_task()

        def on_item(name, index, rec):
            if index == 0:
                task.cancel()

        await WorkflowRun(w, engines={"target": engine}).run({"questions": QUESTIONS}, record_path=record_path,
                                                            on_item=on_item)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cut_after_first_item())
    cut = load_record(record_path)
    assert cut["status"] == "interrupted"
    assert cut["nodes"]["each"]["details"]["items"][0]["status"] == "done"
    fresh = Server()
    resumed = asyncio.run(WorkflowRun(w, engines={"target": fresh}).run({"questions": QUESTIONS}, resume=cut))
    assert fresh.questions() == ["q1", "q2", "q3"] and resumed["status"] == "complete"


def test_resume_refuses_other_inputs_another_workflow_and_a_changed_file(tmp_path):
    w = _workflow(tmp_path)
    engine = Server()
    record = asyncio.run(WorkflowRun(w, engines={"target": engine}).run(
        {"questions": QUESTIONS}, on_item=_kill_after_first_item(engine)))
    record = json.loads(json.dumps(record))  # as read back from its file
    run = WorkflowRun(w, engines={"target": Server()})
    with pytest.raises(WorkflowError, match=r"cannot resume this record: its inputs differ \(questions: given "
                                            r"\[\"q0\", \"q1\"\], the record has \[\"q0\", \"q1\", \"q2\", \"q3\"\]\)"):
        asyncio.run(run.run({"questions": ["q0", "q1"]}, resume=record))

    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = _workflow(other_dir, MAPPED.replace("concurrency: 1", "concurrency: 3"))
    with pytest.raises(WorkflowError, match=f"cannot resume this record: it was written by {tmp_path}/wf.yaml, "
                                            "another workflow"):
        asyncio.run(WorkflowRun(other, engines={"target": Server()}).run({"questions": QUESTIONS}, resume=record))

    (tmp_path / "wf.yaml").write_text(MAPPED.replace('prompt: "${item}"', 'prompt: "Q: ${item}"'))
    changed = load_workflow(tmp_path / "wf.yaml")
    with pytest.raises(WorkflowError, match="the file has changed since the record was written"):
        asyncio.run(WorkflowRun(changed, engines={"target": Server()}).run({"questions": QUESTIONS}, resume=record))

    # where the server is reached is not what the workflow computes: a new address resumes
    (tmp_path / "wf.yaml").write_text(MAPPED.replace("127.0.0.1:9", "127.0.0.1:10"))
    moved = load_workflow(tmp_path / "wf.yaml")
    fresh = Server()
    asyncio.run(WorkflowRun(moved, engines={"target": fresh}).run({"questions": QUESTIONS}, resume=record))
    assert fresh.questions() == ["q1", "q2", "q3"]

    with pytest.raises(WorkflowError, match="no such run record"):
        load_record(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(WorkflowError, match="not a readable run record"):
        load_record(tmp_path / "bad.json")
    assert record["schema_version"] == 1
    old = {k: v for k, v in record.items() if k != "schema_version"}  # as records were
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(WorkflowError, match=r"old.json \(a run record\) has no schema_version .*; this stepspec "
                                            r"reads schema 1: migrate it once with `stepspec "
                                            r"bench migrate --record .*old.json`, or run the "
                                            r"workflow without --resume"):
        load_record(tmp_path / "old.json")
    migrate = subprocess.run([sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "bench",
                              "migrate", "--record", str(tmp_path / "old.json")], capture_output=True, text=True)
    assert migrate.returncode == 0, migrate.stderr
    assert load_record(tmp_path / "old.json") == record


# -- the command line, on a tool-only workflow (no model) ---------------------------------

TOOLS_ONLY = """\
allowed_modules: [test_workflow_resume]
tools:
  shout: {function: "test_workflow_resume:shout"}
workflow:
  inputs:
    words: {type: list}
  nodes:
    each: {map: "${inputs.words}", node: {tool: shout, args: {word: "${item}"}}, concurrency: 1}
  outputs: {loud: "${each.output}"}
"""


def shout(word: str) -> str:
    """Upper-cases ``word``, logging each call to $SHOUT_LOG; fails for a word in $SHOUT_REFUSE."""
    with open(os.environ["SHOUT_LOG"], "a") as f:
        f.write(word + "\n")
    if word in os.environ.get("SHOUT_REFUSE", "").split(","):
        raise RuntimeError(f"refusing {word}")
    return word.upper()


def test_run_command_prints_the_resume_command_and_resume_runs_the_rest(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(TOOLS_ONLY)
    log, record_path = tmp_path / "calls.log", tmp_path / "record.json"
    env = {**ENV, "SHOUT_LOG": str(log), "SHOUT_REFUSE": "b"}
    r = subprocess.run(CLI + ["run", str(path), "--input", 'words=["a", "b", "c"]', "--output", str(record_path)],
                       capture_output=True, text=True, check=False, timeout=120, env=env)
    assert r.returncode == 1, r.stderr
    assert "done each[0]" in r.stdout and "failed each[1]" in r.stdout
    command = f"stepspec run {path} --resume {record_path}"
    assert command in r.stderr, r.stderr
    record = load_record(record_path)
    assert record["nodes"]["each"]["error"].startswith("MapError: 2 of 3 items finished (1 failed; ")
    assert log.read_text().split() == ["a", "b", "c"]

    # the printed command, as it is (the inputs come from the record)
    r = subprocess.run(CLI + command.split()[1:], capture_output=True, text=True, check=False, timeout=120,
                       env={**env, "SHOUT_REFUSE": ""})
    assert r.returncode == 0, r.stderr
    assert f"resuming {record_path}: 0 of 1 nodes done before; each: 2 of 3 items done before" in r.stdout
    assert log.read_text().split() == ["a", "b", "c", "b"]  # only the failed item ran again
    assert load_record(record_path)["outputs"] == {"loud": ["A", "B", "C"]}

    # other inputs than the record's: named, before anything runs
    r = subprocess.run(CLI + command.split()[1:] + ["--input", 'words=["x"]'], capture_output=True, text=True,
                       check=False, timeout=120, env=env)
    assert r.returncode == 2 and "its inputs differ (words: given [\"x\"]" in r.stderr, r.stderr
    assert log.read_text().split() == ["a", "b", "c", "b"]


# -- the HTTP engine, when its server dies mid-run ---------------------------------------


class _Dying(BaseHTTPRequestHandler):
    """Serves /v1/models; a POST finds the server dying: it stops listening and resets the
    connection without an answer, as a server killed in the middle of a request does."""

    def do_GET(self):
        body = json.dumps({"data": [{"id": "m", "max_model_len": 64}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.server.shutdown()
        self.server.server_close()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()  # a reset, no FIN before it: the client's read fails (ReadError)
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("when", ["between requests", "during a request"])
def test_a_server_that_dies_after_start_is_named_with_the_fix_within_seconds(when):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dying)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    engine = OpenAIEngine(url + "/v1", "m")  # the default retries and backoff

    async def go():
        try:
            await engine.start()
            if when == "between requests":
                server.shutdown()
                server.server_close()  # the port now refuses connections, as a killed server's does
            t0 = time.perf_counter()
            with pytest.raises(EngineUnavailableError) as e:
                await engine.generate([GenerationRequest("hi", Sampling(max_tokens=4))])
            return time.perf_counter() - t0, str(e.value)
        finally:
            await engine.close()

    seconds, message = asyncio.run(go())
    assert seconds < 10
    assert f"the OpenAI-compatible server at {url} stopped answering during the run" in message
    assert "4 attempts on /v1/completions" in message and "restart it" in message and "--resume" in message


# -- a real vLLM server, killed mid-run ----------------------------------------------

SERVED = """\
engines:
  target: {backend: openai, base_url: "URL/v1", model: tiny}
reasoners:
  solver: {target: target, strategy: target-only, budget: {max_tokens: 6, max_steps: 2, max_step_tokens: 3}}
workflow:
  inputs:
    questions: {type: list}
  nodes:
    each: {map: "${inputs.questions}", node: {reason: solver, prompt: "${item}"}, concurrency: 1}
  outputs:
    answers: "${each.output}"
"""


TINY_SERVER = {"max_model_len": 256, "kv_cache_gib": 1 / 16}


async def _run_and_close(run: WorkflowRun, **options) -> dict:
    try:
        return await run.run({"questions": ["2 + 3?", "4 * 5?", "9 - 1?", "8 / 2?"]}, **options)
    finally:
        await run.close()


@pytest.mark.vllm
@pytest.mark.server
def test_a_real_server_killed_mid_run_keeps_the_finished_item_and_resume_runs_the_rest(tiny_model_path, tmp_path):
    port, log, record_path = free_port(), tmp_path / "server.log", tmp_path / "record.json"
    url = f"http://127.0.0.1:{port}"
    w = _workflow(tmp_path, SERVED.replace("URL", url))
    ran, times = [], {}

    with vllm_server(tiny_model_path, port, log, **TINY_SERVER) as server:
        def crash_after_first_item(name, index, rec):
            ran.append(index)
            if index == 0:
                stop_process(server, crash=True)  # SIGKILL by PID, between item 0 and item 1
                times["killed"] = time.perf_counter()

        def on_node(name, rec):
            times[name] = time.perf_counter()

        record = asyncio.run(_run_and_close(WorkflowRun(w), record_path=record_path, on_item=crash_after_first_item,
                                            on_node=on_node))
    each = record["nodes"]["each"]
    items = each["details"]["items"]
    assert record["status"] == "failed" and ran == [0, 1], each["error"]
    assert [i["status"] for i in items] == ["done", "failed", "skipped", "skipped"]
    assert times["each"] - times["killed"] < 10  # reported within seconds (retries: 0.5 + 1 + 2 s)
    assert each["error"].startswith("MapError: 1 of 4 items finished (1 failed, 2 not started; ")
    assert f"the OpenAI-compatible server at {url} stopped answering during the run" in items[1]["error"]
    assert "restart it on the same address, then resume the run (`stepspec run FILE --resume RECORD`" in each["error"]
    saved = load_record(record_path)
    assert saved["nodes"]["each"]["details"]["items"][0] == json.loads(json.dumps(items[0]))
    assert isinstance(items[0]["output"], str) and items[0]["details"]["stats"]

    ran.clear()
    with vllm_server(tiny_model_path, port, log, **TINY_SERVER):  # restarted on the same address
        resumed = asyncio.run(_run_and_close(WorkflowRun(w), record_path=record_path, resume=saved,
                                             on_item=lambda name, index, rec: ran.append(index)))
    assert ran == [1, 2, 3]  # item 0 was not asked again
    assert resumed["status"] == "complete" and resumed["resumed"] == 1
    again = load_record(record_path)
    assert again["nodes"]["each"]["details"]["items"][0] == saved["nodes"]["each"]["details"]["items"][0]
    assert [i["status"] for i in again["nodes"]["each"]["details"]["items"]] == ["done"] * 4
    assert again["outputs"]["answers"][0] == items[0]["output"] and len(again["outputs"]["answers"]) == 4
