"""How many calls the served model writes against how many a BFCL entry needs, with and without a
system message that guides it: the probe that chose ``stepspec serve``'s call guidance (issue 79).

Entries from BFCL's data (the ``.venv-bfcl`` that ``bfcl_bench.py`` makes), past those any report
uses (``--start 100``), sent through the OpenAI tool API to a running server (``stepspec serve
--strategy target-only --name openbmb/MiniCPM-SALA-FC --no-call-guidance`` for the plain arm); an
entry is *right by count* when the reply's calls are as many as its ground truth's (none for
irrelevance). Not BFCL's checker: it says whether the model writes a call per item, not whether
the arguments are right (``bfcl_bench.py`` does that on the reported entries).

    python benchmarks/call_guidance.py --port 8199 --category parallel --start 100 --n 30 \\
        --system-file guidance.txt --json out/parallel_guided.json
"""

from __future__ import annotations

import argparse
import glob
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}  # BFCL's Python type names


def openai_schema(schema):
    """A BFCL parameter schema with JSON Schema's type names (as BFCL's OpenAI handler sends it)."""
    if isinstance(schema, list):
        return [openai_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: openai_schema(v) for k, v in schema.items()}
    if isinstance(out.get("type"), str):
        out["type"] = TYPES.get(out["type"], out["type"])
    return out


def entries(category: str, start: int, n: int) -> list[tuple[dict, int]]:
    """(entry, calls its ground truth makes) for BFCL entries start .. start + n of ``category``."""
    (data,) = glob.glob(str(ROOT / ".venv-bfcl/lib/python*/site-packages/bfcl_eval/data"))
    rows = [json.loads(line) for line in Path(data, f"BFCL_v4_{category}.json").read_text().splitlines()]
    answers = Path(data, "possible_answer", f"BFCL_v4_{category}.json")
    truth = {json.loads(line)["id"]: len(json.loads(line)["ground_truth"])
             for line in answers.read_text().splitlines()} if answers.exists() else {}
    return [(row, truth.get(row["id"], 0)) for row in rows[start:start + n]]


def main() -> None:
    from openai import OpenAI

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--category", required=True)
    p.add_argument("--start", type=int, default=100)
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--system-file", type=Path, help="a system message sent before each entry's question")
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args()
    client = OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key="none")
    system = [{"role": "system", "content": a.system_file.read_text().strip()}] if a.system_file else []
    rows = []
    for entry, needed in entries(a.category, a.start, a.n):
        tools = [{"type": "function", "function": {"name": f["name"].replace(".", "_"), "description": f["description"],
                                                   "parameters": openai_schema(f["parameters"])}}
                 for f in entry["function"]]
        t0 = time.perf_counter()
        reply = client.chat.completions.create(model="openbmb/MiniCPM-SALA-FC", messages=system + entry["question"][0],
                                               tools=tools, temperature=0, max_tokens=512)
        message = reply.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
        rows.append({"id": entry["id"], "n": len(calls), "exp": needed, "s": round(time.perf_counter() - t0, 2),
                     "calls": calls, "content": message.content})
    right = sum(r["n"] == r["exp"] for r in rows)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(rows, indent=1))
    print(f"{a.category} {a.start}-{a.start + len(rows) - 1}: right by count {right}/{len(rows)}")


if __name__ == "__main__":
    main()
