import ast
import subprocess
import sys
from pathlib import Path


def test_importing_stepspec_packages_loads_neither_vllm_nor_torch():
    code = (
        "import sys\n"
        "import stepspec, stepspec.engine, stepspec.orchestrator, stepspec.judges, stepspec.routers, stepspec.workflows\n"
        "from stepspec import Reasoner, ReasonerConfig, Agent\n"
        "import stepspec.engine.vllm_backend, stepspec.engine.openai_backend, stepspec.engine.models, stepspec.engine.speculation\n"
        "import stepspec.workflows.cli.app, stepspec.workflows.eval.datasets, stepspec.orchestrator.reasoner, stepspec.orchestrator.strategies\n"
        "heavy = sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported at package import time: {r.stdout.strip()}"


ROOT = Path(__file__).resolve().parent.parent
# the rooms of stepspec/ (its sub-packages), each with its layer below
PACKAGES = tuple(sorted(p.name for p in (ROOT / "stepspec").iterdir() if (p / "__init__.py").is_file()))
# Layers, lowest first: a module imports only from lower layers or its own unit. Within
# stepspec/workflows/ each sub-package is a unit of its own.
LAYER = {"common": 0, "engine": 1, "judges": 2, "routers": 2, "orchestrator": 3,
         "workflows.agents": 4, "workflows.eval": 4, "workflows.examples": 5, "workflows.routing": 5,
         "workflows.flows": 5, "workflows.align": 5, "workflows.serve": 6, "workflows.cli": 7}


def _unit(module: str) -> str | None:
    """The layer unit of a module name (stepspec.workflows.eval.bench -> workflows.eval), or None if not ours."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "stepspec" or parts[1] not in PACKAGES:
        return None
    if parts[1] == "workflows" and len(parts) > 2 and f"workflows.{parts[2]}" in LAYER:
        return f"workflows.{parts[2]}"
    return parts[1]


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / "stepspec" / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


def _imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names imported from it) for every absolute import in the file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, tuple(a.name for a in node.names)))
    return out


def test_data_flows_one_way():
    """common <- engine <- stepspec/judges/routers <- orchestrator <- workflows, and inside workflows
    agents/eval <- examples/routing/flows <- cli: no import goes sideways or back up."""
    violations = []
    modules = _modules()
    assert _unit("stepspec.workflows.eval.bench") == "workflows.eval" and "stepspec.orchestrator.driver" in modules
    for module, path in modules.items():
        unit = _unit(module)
        if unit not in LAYER:
            if module != "stepspec.workflows":  # (the package of workflows' units, a docstring)
                violations.append(f"{module} is in no layer: give its unit ({unit}) one in LAYER")
            continue
        for imported, _ in _imports(path):
            other = _unit(imported)
            if other is not None and other != unit and (other not in LAYER or LAYER[other] >= LAYER[unit]):
                violations.append(f"{module} imports {imported}")
    assert violations == []


def test_no_private_name_crosses_a_unit():
    violations = [f"{module} imports {name} from {imported}"
                  for module, path in _modules().items()
                  for imported, names in _imports(path)
                  for name in names
                  if name.startswith("_") and _unit(imported) not in (None, _unit(module))]
    assert violations == []


def test_no_import_cycle():
    import networkx as nx

    modules = _modules()
    graph = nx.DiGraph()
    for module, path in modules.items():
        for imported, names in _imports(path):
            # "from package import module" imports the module
            targets = [f"{imported}.{n}" for n in names if f"{imported}.{n}" in modules] or [imported]
            graph.add_edges_from((module, t) for t in targets if t in modules and t != module)
    assert list(nx.simple_cycles(graph)) == []
