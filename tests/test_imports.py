import subprocess
import sys


def test_importing_stepspec_packages_loads_neither_vllm_nor_torch():
    code = (
        "import sys\n"
        "import engine, orchestrator, judges, routers, workflows\n"
        "import engine.vllm_backend, engine.openai_backend, engine.models, engine.speculation\n"
        "import workflows.cli, workflows.solve, workflows.datasets\n"
        "heavy = sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported at package import time: {r.stdout.strip()}"
