"""Where a BFCL call's seconds go: reading the prompt (its prefill) against writing the reply, per arm.

Each entry's first turn is sent, as BFCL's own client sends it (its messages, its tools converted by
BFCL's own code, temperature 0), to a server of each arm (``bfcl_bench.py``'s arms and flags, a server per
arm, cold caches) twice in a row: *cold*, its prompt not in the prefix cache (every entry declares its own
tools, so its prompt is new past the chat template's opening), then *warm*, the same request again, its
whole prompt cached, so that its seconds are the reply's writing alone. The difference is what reading the
prompt cost.

Worked example: simple_python_2, 339 prompt tokens, specreason: cold 3.20 s, warm 1.06 s: reading the
prompt took 2.15 s (67% of the call, 158 prompt tokens a second), writing the 29-token call 1.06 s.

    python benchmarks/call_cost_split.py --out benchmarks/measured/call_cost_split_cpu \\
        --categories simple_python,multiple,live_multiple,parallel_multiple --per-category 10 \\
        --arms target-only,target-only-suffix,specreason,vllm-server

Resumable: an arm's entries already in its JSON lines file are not sent again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bfcl_bench import MODEL, in_bfcl, serve  # noqa: E402
from served import cpu_model, stop_server  # noqa: E402

# BFCL's own conversion of an entry to its client's request (run in BFCL's environment).
REQUESTS = """
import json, sys
from bfcl_eval.constants.enums import ModelStyle
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
from bfcl_eval.model_handler.utils import convert_to_tool
from bfcl_eval.utils import load_dataset_entry
for e in load_dataset_entry(sys.argv[1])[:int(sys.argv[2])]:
    tools = convert_to_tool(e["function"], GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)
    print(json.dumps({"id": e["id"], "messages": e["question"][0], "tools": tools}))
"""


def requests(category: str, n: int) -> list[dict]:
    """The first ``n`` entries of ``category`` as BFCL's client would send their first turn."""
    return [json.loads(line) for line in in_bfcl(REQUESTS, category, str(n)).splitlines() if line.startswith("{")]


def send(port: int, entry: dict) -> tuple[float, dict]:
    """(seconds, reply) of one chat completion of ``entry`` on the server at ``port``."""
    body = {"model": MODEL, "messages": entry["messages"], "tools": entry["tools"], "temperature": 0}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=900) as r:
        reply = json.load(r)
    return time.perf_counter() - t0, reply


def calls(reply: dict) -> list[list[str]]:
    """The reply's calls as [name, arguments]."""
    message = reply["choices"][0]["message"]
    return [[c["function"]["name"], c["function"]["arguments"]] for c in message.get("tool_calls") or []]


def run_arm(arm: str, out: Path, entries: dict[str, list[dict]], port: int) -> None:
    """Each entry cold, then warm, on a server of ``arm``'s own; a JSON line per entry."""
    path = out / f"{arm}.jsonl"
    done = {r["id"] for r in read_rows(path)}
    todo = [(c, e) for c, es in entries.items() for e in es if e["id"] not in done]
    if not todo:
        return
    server = serve(arm, port, out / f"serve-{arm}.log")
    try:
        for category, entry in todo:
            cold_s, cold = send(port, entry)
            warm_s, warm = send(port, entry)
            usage, written = cold["usage"], calls(cold)
            row = {"id": entry["id"], "category": category, "arm": arm,
                   "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                   "cold_s": round(cold_s, 3), "warm_s": round(warm_s, 3), "calls": written,
                   "same_warm": written == calls(warm)}
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")
    finally:
        stop_server(server)


def read_rows(path: Path) -> list[dict]:
    """An arm's JSON lines file, a row per entry (none where it does not exist yet)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def median(rows: list[dict], value) -> float:
    """The median of ``value(row)`` over ``rows``."""
    return statistics.median(value(r) for r in rows)


def report(out: Path, categories: list[str], arms: list[str]) -> str:
    """report.md: per category and arm, the medians of the cold and warm seconds and the prompt's share."""
    lines = ["# Where a BFCL call's seconds go", "",
             f"CPU: {cpu_model()}. Each entry's first turn sent twice in a row to a server of each arm (cold caches "
             "per arm): cold, then warm (its whole prompt cached). Reading the prompt = cold - warm.", "",
             "| category | arm | entries | prompt tokens | cold s | warm s (writing) | reading the prompt: share "
             "| prompt tokens a second | same calls warm |", "|---|---|---|---|---|---|---|---|---|"]
    by_arm = {arm: read_rows(out / f"{arm}.jsonl") for arm in arms}
    for category in categories:
        for arm in arms:
            rows = [r for r in by_arm[arm] if r["category"] == category]
            if not rows:
                continue
            share = median(rows, lambda r: (r["cold_s"] - r["warm_s"]) / r["cold_s"])
            rate = median(rows, lambda r: r["prompt_tokens"] / max(r["cold_s"] - r["warm_s"], 1e-9))
            lines.append(f"| {category} | {arm} | {len(rows)} | {median(rows, lambda r: r['prompt_tokens']):.0f} | "
                         f"{median(rows, lambda r: r['cold_s']):.2f} | {median(rows, lambda r: r['warm_s']):.2f} | "
                         f"{share:.0%} | {rate:.0f} | {sum(r['same_warm'] for r in rows)}/{len(rows)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--categories", default="simple_python,multiple,live_multiple,parallel_multiple")
    p.add_argument("--per-category", type=int, default=10)
    p.add_argument("--arms", default="target-only,target-only-suffix,specreason,vllm-server")
    p.add_argument("--port", type=int, default=8190)
    p.add_argument("--report", action="store_true", help="only rebuild report.md from the JSON lines files")
    a = p.parse_args()
    categories, arms, out = a.categories.split(","), a.arms.split(","), a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not a.report:
        entries = {c: requests(c, a.per_category) for c in categories}
        for arm in arms:
            run_arm(arm, out, entries, a.port)
    (out / "report.md").write_text(report(out, categories, arms))
    print((out / "report.md").read_text())


if __name__ == "__main__":
    main()
