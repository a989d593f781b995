"""BFCL v4 against `stepspec serve`, one arm (strategy) at a time, paired against a baseline arm.

BFCL's own command line generates (``bfcl generate``) through the OpenAI tool API of a
``stepspec serve`` started per arm (cold caches), and BFCL's own checker scores it
(``bfcl evaluate --partial-eval``). ``bfcl-eval`` pins numpy 1.x, so it lives in a virtual
environment of its own (``.venv-bfcl``, made here on first use), as a user would run it.
BFCL's registry entry ``openbmb/MiniCPM-SALA-FC`` is a plain OpenAI chat-completions
function-calling client (it reads ``OPENAI_BASE_URL``); the server serves that name.

Arms: a strategy's name (its server binds calls to their schemas, the default, and guides the model
to a call per item, ``--call-guidance``), the same with
``-unbound`` (``--no-constrained-calls``: calls checked after they are written), ``-unguided``
(without ``--call-guidance``: ``stepspec serve``'s defaults) or ``-suffix`` (``--spec suffix``: the target's
token-level method suffix decoding, specreason's target's), then optionally ``@`` and strategy options
joined by ``+`` (``specreason@draft_opening=false``: ``--opt draft_opening=false``), and
``vllm-server``: vLLM's own OpenAI server on the bundled 1.5B at its fastest (the 0.5B drafting
its tokens inside it, as target-only) with the best parser for the pair, ``hermes_json`` (which
stepspec's vLLM plug-in registers in vLLM's registry), the peer; ``vllm-server-hermes``: the same
with vLLM's own ``hermes`` parser.

    python benchmarks/bfcl_bench.py --out benchmarks/measured/bfcl_cpu \\
        --categories simple_python,multiple,parallel --per-category 50

Resumable: BFCL skips entries already in an arm's result files, so running the same
command again continues where it stopped. ``--report`` alone scores the files again and
rebuilds report.md: per category and arm, BFCL's accuracy, the entries lost / gained / net against
the baseline arm (``--baseline``, target-only by default) on the same entries, and the median seconds
per model call (BFCL's latency).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from served import cpu_model, start_server, start_vllm_server, stop_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-bfcl"
# bfcl-eval imports qwen_agent, which needs soundfile and does not require it
BFCL = ("bfcl-eval==2026.3.23", "soundfile")
MODEL = "openbmb/MiniCPM-SALA-FC"  # BFCL's registry: an OpenAI chat-completions FC client
ARMS = ("target-only", "specreason", "draft-only")
# An arm is a strategy's name, then optionally -unguided, then -unbound, then -suffix: what each suffix does to
# the flags of its server (the first list is the default, the second the suffix's).
ARM_SUFFIXES = {"-suffix": ([], ["--spec", "suffix"]), "-unbound": ([], ["--no-constrained-calls"]),
                "-unguided": (["--call-guidance"], [])}
CONTEXT = 16384  # multi-turn entries hold the functions' docs and every turn: past 4096 tokens


def ensure_bfcl() -> Path:
    """``bfcl`` in its own virtual environment, installed once."""
    bfcl = VENV / "bin" / "bfcl"
    if not bfcl.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *BFCL], check=True)
    return bfcl


def in_bfcl(code: str, *args: str) -> str:
    """What Python ``code`` (its ``sys.argv[1:]`` ``args``) prints, run in BFCL's own environment
    (bfcl-eval pins its dependencies), BFCL's project root a scratch folder."""
    out = subprocess.run([str(ensure_bfcl().parent / "python"), "-c", code, *args], check=True, capture_output=True,
                         text=True, env={**os.environ, "BFCL_PROJECT_ROOT": "/tmp/bfcl-ids"})
    return out.stdout


def category_ids(category: str, n: int) -> list[str]:
    """The first ``n`` entry ids of a BFCL category, from the data its wheel ships."""
    code = ("import json, sys; from bfcl_eval.utils import load_dataset_entry; "
            "print(json.dumps([e['id'] for e in load_dataset_entry(sys.argv[1])][:int(sys.argv[2])]))")
    return json.loads(in_bfcl(code, category, str(n)).strip().splitlines()[-1])


def serve(arm: str, port: int, log: Path) -> subprocess.Popen:
    """The server of ``arm`` serving BFCL's model name, once healthy: ``stepspec serve`` with the
    arm's strategy (``-unbound``: calls not bound to their schemas), or vLLM's own server."""
    if arm.startswith("vllm-server"):
        return vllm_server(port, log, parser=arm.removeprefix("vllm-server").removeprefix("-") or "hermes_json")
    strategy, _, options = arm.partition("@")
    flags = [flag for option in options.split("+") if option for flag in ("--opt", option)]
    for suffix, (default, given) in ARM_SUFFIXES.items():
        flags += given if strategy.endswith(suffix) else default
        strategy = strategy.removesuffix(suffix)
    return start_server(["--strategy", strategy, "--name", MODEL, "--max-model-len", str(CONTEXT), *flags], port, log)


def vllm_server(port: int, log: Path, parser: str) -> subprocess.Popen:
    """vLLM's OpenAI server on the bundled target, the draft model inside it, tool parser ``parser``;
    a reply without ``max_tokens`` (BFCL sends none) gets ``stepspec serve``'s default budget, not the
    whole context (a reply that loops would write 16k tokens)."""
    from stepspec.engine.dtype import choose_dtype
    from stepspec.engine.models import BUNDLED_DRAFT, BUNDLED_TARGET, resolve_model
    from stepspec.engine.speculation import speculative_config
    from stepspec.orchestrator.budget import Budget
    from stepspec.orchestrator.strategies import STRATEGIES

    target, draft = resolve_model(BUNDLED_TARGET), resolve_model(BUNDLED_DRAFT)
    return start_vllm_server(target, MODEL, port, log, dtype=choose_dtype("auto", target, cpu=True).dtype,
                             max_model_len=CONTEXT, kv_cache_gib=2,
                             speculative_config=speculative_config(STRATEGIES["target-only"].target_spec,
                                                                   draft_model=draft),
                             args=["--enable-auto-tool-choice", "--tool-call-parser", parser,
                                   "--override-generation-config", json.dumps({"max_new_tokens": Budget().max_tokens})])


def run_arm(arm: str, out: Path, ids: dict[str, list[str]], port: int) -> None:
    """Generate ``arm``'s entries (those not yet in its result files) on a server of its own."""
    root = out / arm
    root.mkdir(parents=True, exist_ok=True)
    (root / "test_case_ids_to_generate.json").write_text(json.dumps(ids, indent=1))
    env = {**os.environ, "BFCL_PROJECT_ROOT": str(root), "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
           "OPENAI_API_KEY": "none"}
    server = serve(arm, port, out / f"serve-{arm}.log")
    try:
        subprocess.run([str(ensure_bfcl()), "generate", "--model", MODEL, "--run-ids", "--temperature", "0",
                        "--num-threads", "1"], env=env, check=True)
    finally:
        stop_server(server)


def evaluate(arm: str, out: Path, categories: list[str]) -> None:
    """BFCL's checker on the entries ``arm`` generated (``--partial-eval``)."""
    env = {**os.environ, "BFCL_PROJECT_ROOT": str(out / arm), "OPENAI_API_KEY": "none"}  # its handler is built
    subprocess.run([str(ensure_bfcl()), "evaluate", "--model", MODEL, "--test-category", ",".join(categories),
                    "--partial-eval"], env=env, check=True, stdout=subprocess.DEVNULL)


def bfcl_files(out: Path, arm: str, kind: str, category: str) -> list[list[dict]]:
    """The JSON lines of each of ``arm``'s BFCL files of ``kind`` ("result" or "score") for ``category``
    (a score file's first line is its summary)."""
    return [[json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for path in (out / arm / kind / MODEL.replace("/", "_")).rglob(f"BFCL_v4_{category}_{kind}.json")]


def failure_classes(out: Path, arm: str, category: str) -> dict[str, int]:
    """How many of ``arm``'s failed entries on ``category`` BFCL's checker put in each class (its
    ``error_type``, e.g. ``parallel_function_checker_no_order:wrong_count``), most first."""
    classes = {}
    for lines in bfcl_files(out, arm, "score", category):
        for e in lines[1:]:
            kind = e.get("error_type", "unknown")
            classes[kind] = classes.get(kind, 0) + 1
    return dict(sorted(classes.items(), key=lambda kv: -kv[1]))


def at_budget(out: Path, arm: str, category: str) -> int:
    """How many of ``arm``'s replies on ``category`` ran to the reply budget (``Budget().max_tokens``
    output tokens: a model that loops, or never ends its turn)."""
    from stepspec.orchestrator.budget import Budget

    cap = Budget().max_tokens
    return sum(int(r.get("output_token_count") or 0) >= cap
               for lines in bfcl_files(out, arm, "result", category) for r in lines)


def read_arm(out: Path, arm: str, category: str) -> tuple[dict[str, bool], list[float]]:
    """(each entry's correctness, each model call's seconds) of ``arm`` on ``category``."""
    results = [r for lines in bfcl_files(out, arm, "result", category) for r in lines]
    failed = {e["id"] for lines in bfcl_files(out, arm, "score", category) for e in lines[1:] if "id" in e}
    seconds = []
    for r in results:
        latency = r.get("latency")
        seconds += [float(x) for x in _flat(latency)] if latency is not None else []
    return {r["id"]: r["id"] not in failed for r in results}, seconds


def _flat(value) -> list:
    return [y for x in value for y in _flat(x)] if isinstance(value, list) else [value]


def report(out: Path, categories: list[str], arms: list[str], baseline: str = "target-only") -> str:
    """report.md: accuracy per category and arm, paired against ``baseline`` (an arm), seconds per call."""
    lines = ["# BFCL v4 against `stepspec serve`", "",
             f"CPU: {cpu_model()}. Model name served: `{MODEL}`; BFCL's own generate and evaluate "
             "(`--partial-eval`); one request at a time; each arm its own server (cold caches).", "",
             f"| category | arm | entries | accuracy | vs {baseline}: lost / gained / net loss | median s per call | "
             f"speed vs {baseline} | replies at the budget |", "|---|---|---|---|---|---|---|---|"]
    for category in categories:
        base, base_s = read_arm(out, baseline, category) if baseline in arms else ({}, [])
        for arm in arms:
            correct, seconds = read_arm(out, arm, category)
            if not correct:
                continue
            n, right = len(correct), sum(correct.values())
            paired = [i for i in correct if i in base]
            lost = sum(base[i] and not correct[i] for i in paired)
            gained = sum(correct[i] and not base[i] for i in paired)
            med = statistics.median(seconds) if seconds else float("nan")
            speed = statistics.median(base_s) / med if base_s and seconds else float("nan")
            vs = "baseline" if arm == baseline else f"{lost} / {gained} / {lost - gained}"
            lines.append(f"| {category} | {arm} | {n} | {right / n:.1%} ({right}) | {vs} | {med:.2f} | {speed:.2f}x "
                         f"| {at_budget(out, arm, category)} |")
    lines += ["", "Failures by BFCL's class (its score files' `error_type`), per category and arm:", "",
              "| category | arm | failed | classes |", "|---|---|---|---|"]
    for category in categories:
        for arm in arms:
            classes = failure_classes(out, arm, category)
            if classes:
                shown = ", ".join(f"{kind} {n}" for kind, n in classes.items())
                lines.append(f"| {category} | {arm} | {sum(classes.values())} | {shown} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--categories", default="simple_python,multiple,parallel,multi_turn_base")
    p.add_argument("--per-category", type=int, default=50)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--baseline", default="target-only", help="the arm the others are paired against")
    p.add_argument("--port", type=int, default=8190)
    p.add_argument("--report", action="store_true", help="only score the files again and rebuild report.md")
    a = p.parse_args()
    categories, arms, out = a.categories.split(","), a.arms.split(","), a.out.resolve()  # BFCL needs it absolute
    if not a.report:
        ensure_bfcl()
        ids = {c: category_ids(c, a.per_category) for c in categories}
        for arm in arms:
            run_arm(arm, out, ids, a.port)
    for arm in arms:
        evaluate(arm, out, categories)
    (out / "report.md").write_text(report(out, categories, arms, a.baseline))
    print((out / "report.md").read_text())


if __name__ == "__main__":
    main()
