import subprocess
import sys


def test_importing_stepspec_packages_loads_neither_vllm_nor_torch():
    code = (
        "import sys\n"
        "import engine, orchestrator, judges, routers, workflows\n"
        "import engine.vllm_backend, engine.openai_backend, engine.models, engine.speculation\n"
        "import workflows.cli, workflows.datasets, orchestrator.reasoner, orchestrator.strategies\n"
        "heavy = sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported at package import time: {r.stdout.strip()}"


def test_data_flows_one_way():
    """workflows -> orchestrator -> judges/routers -> engine: no import goes back up."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    layer = {"engine": 0, "judges": 1, "routers": 1, "orchestrator": 2, "workflows": 3}
    violations = []
    for package, level in layer.items():
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top in layer and top != package and layer[top] >= level:
                        violations.append(f"{path.relative_to(root)} imports {name}")
    assert violations == []
