"""What `pip install .` puts on a user's machine: one top-level package, `stepspec`, with the data
files the code reads (the published cost profiles, the example workflows, the lm-eval tasks, the
committed draft adapter), and the entry points naming it."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_adds_only_stepspec_at_the_top_level_with_its_data(tmp_path):
    source = tmp_path / "source"  # the files a build reads, so no earlier build's leftovers join the wheel
    shutil.copytree(ROOT / "stepspec", source / "stepspec", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = tmp_path.glob("stepspec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    dist_info = next(t for t in top if t.endswith(".dist-info"))
    assert top == {"stepspec", dist_info}
    for data in ("stepspec/workflows/eval/cost_profiles.yaml", "stepspec/workflows/examples/gsm8k_specreason.yaml",
                 "stepspec/workflows/lm_eval_tasks/gsm8k_stepspec.yaml"):
        assert data in names, data
    assert any(n.startswith("stepspec/engine/adapters/") and n.endswith(".safetensors") for n in names)
    archive = zipfile.ZipFile(wheel)
    assert archive.read(f"{dist_info}/top_level.txt").decode().split() == ["stepspec"]
    entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    assert "stepspec = stepspec.workflows.cli.app:main" in entry_points
    for plugin in ("stepspec.engine.stop_string_metrics:register", "stepspec.engine.cpu_sampling_fix:register",
                   "stepspec.workflows.agents.parsers:register"):
        assert plugin in entry_points, plugin  # vLLM loads them in every process of its own
