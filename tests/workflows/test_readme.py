"""The README works as typed: its Python example runs (on scripted engines instead of the
bundled pair), every `stepspec` command in it parses with the flags it gives, every `make`
target it names exists, and every link in it points at a file in the checkout."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fake_engine import ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CLI = [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()"]


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def shell_commands(program: str) -> list[list[str]]:
    """Each ``program ...`` line of the README's bash blocks, split as a shell splits it
    (comments dropped, continued lines joined)."""
    found = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == program:
                found.append(words)
    return found


def test_the_python_example_runs_as_written(monkeypatch, capsys):
    """The example of the Python section, run as a script, on scripted engines standing in for
    the models ``from_models`` would load."""
    from stepspec.orchestrator import reasoner as module

    built = []

    def scripted(wanted, names=None, on_prepare=None):
        engines = {role: ScriptedEngine(role, continuation=lambda p: "1. 12 * 13 = 156.\n\n\\boxed{156}")
                   for role in wanted}
        built.append(set(engines))
        return engines

    monkeypatch.setattr(module, "build_engines", scripted)
    section = README[README.index("## Python"):README.index("## Workflows")]
    (example,) = re.findall(r"```python\n(.*?)```", section, re.S)
    exec(compile(example, "README.md", "exec"), {"__name__": "__main__"})
    assert built == [{"target", "draft"}]
    out = capsys.readouterr().out
    assert "156" in out and "draft" in out


@pytest.mark.parametrize("command", shell_commands("stepspec"), ids=" ".join)
def test_each_stepspec_command_names_a_command_and_flags_it_has(command):
    """``stepspec SUB [SUB2] ... --flag`` in the README: its subcommand exists and takes every flag
    the line gives (the command's --help lists it); the models are not loaded."""
    words = command[1:]
    path = []
    for w in words:
        if w.startswith("-") or "/" in w or "." in w or w.startswith('"'):
            break
        path.append(w)
    if path and path[0] == "lm-eval":  # the harness's own command line, flags its own
        path = path[:1]
        flags = []
    else:
        flags = [w.split("=")[0] for w in words if w.startswith("--")]
    r = subprocess.run(CLI + [*path, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, (command, r.stderr)
    helptext = re.sub(r"[│\s]+", " ", r.stdout)
    missing = [f for f in flags if not re.search(rf"{re.escape(f)}(?![\w-])", helptext)]
    assert not missing, f"`{' '.join(command)}`: `stepspec {' '.join(path)}` has no {missing}"


def test_each_make_target_it_names_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    named = {w[1] for w in shell_commands("make") if len(w) > 1}
    assert named and named <= targets, named - targets


def test_each_link_points_at_a_file_of_the_checkout():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    missing = [t for t in links if not t.startswith("http") and not (ROOT / t).exists()]
    assert links and not missing, missing


def test_the_benchmarks_index_has_lines_a_reader_can_read():
    long = [i + 1 for i, line in enumerate((ROOT / "benchmarks" / "README.md").read_text().splitlines())
            if len(line) > 200]
    assert long == [], f"benchmarks/README.md lines over 200 characters: {long}"
