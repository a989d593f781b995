"""`make demo`'s command against the same command with `--strategy target-only`, as a user runs them.

Each command runs ``--runs`` times (default 3), the two alternating, each a fresh process
(engines started cold, as a user's run); the reasoning time is the trace's seconds (engine
start excluded, as the demo's result table reports it). Prints the medians and their ratio
and writes them with every run to ``--json``.

    python benchmarks/demo_speed.py [--runs 3] [--json benchmarks/measured/demo_cpu/demo.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from served import cpu_model  # noqa: E402


def demo_command() -> list[str]:
    """The Makefile's demo command line (after `stepspec`), read from the Makefile itself."""
    text = (ROOT / "Makefile").read_text()
    line = re.search(r"^demo:.*\n(?:#.*\n)*\t.*?stepspec (solve .*)$", text, re.M)
    if line is None:
        raise SystemExit("Makefile: no `demo:` target running `stepspec solve ...`")
    return shlex.split(line.group(1))


def solve(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", *args, "--json"],
                         cwd=ROOT, capture_output=True, text=True, env=os.environ)
    if out.returncode != 0:
        raise SystemExit(f"stepspec {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout)
    return {"seconds": result["trace"]["seconds"], "startup_seconds": result["startup_seconds"],
            "correct": result["correct"], "answer": result["answer"],
            "target_token_share": result["stats"]["target_token_share"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    demo = demo_command()
    strategy = demo.index("--strategy") + 1
    baseline = [*demo[:strategy], "target-only", *demo[strategy + 1:]]
    runs: dict[str, list[dict]] = {"demo": [], "target-only": []}
    for i in range(args.runs):
        for name, command in (("demo", demo), ("target-only", baseline)) if i % 2 == 0 else (
                ("target-only", baseline), ("demo", demo)):
            runs[name].append(solve(command))
            print(f"{name} run {len(runs[name])}: {runs[name][-1]['seconds']:.1f} s, answer "
                  f"{runs[name][-1]['answer']}", file=sys.stderr, flush=True)
    medians = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
    summary = {"cpu": cpu_model(), "demo": " ".join(demo), "target_only": " ".join(baseline), "medians": medians,
               "speedup": medians["target-only"] / medians["demo"], "runs": runs}
    print(f"CPU: {summary['cpu']}\nstepspec {summary['demo']}: {medians['demo']:.1f} s median reasoning\n"
          f"stepspec {summary['target_only']}: {medians['target-only']:.1f} s median reasoning\n"
          f"the demo reasons {summary['speedup']:.2f}x as fast")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
