"""stepspec: reasoning-level speculative orchestration.

The one top-level package. Its rooms are the design's layers, lowest first:
``stepspec.common`` (helpers), ``stepspec.engine`` (the only code that talks to a model),
``stepspec.judges`` and ``stepspec.routers`` (decide about a drafted step, and who writes the
next one), ``stepspec.orchestrator`` (the driver and one step policy per strategy) and
``stepspec.workflows`` (the command line, the server, benchmarks, YAML flows, agents).
Importing it imports neither vLLM nor torch.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stepspec")
except PackageNotFoundError:  # a checkout on sys.path that was never installed
    __version__ = "0+unknown"

# The Python API's entry points, imported on first use (``from stepspec import Reasoner``).
_API = {"Reasoner": "stepspec.orchestrator.reasoner", "ReasonerConfig": "stepspec.orchestrator.config",
        "Agent": "stepspec.workflows.agents.agent"}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'stepspec' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)
