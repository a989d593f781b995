"""The tool parsers stepspec adds to vLLM's tool-parser registry, registered the way vLLM registers
any plug-in: a ``vllm.general_plugins`` entry point (:func:`register`), which vLLM loads in every
process that builds an engine or its server's command line. So ``--tool-call-parser hermes_json``
works in ``stepspec serve`` and in vLLM's own server alike
(``python -m vllm.entrypoints.openai.api_server ... --enable-auto-tool-choice --tool-call-parser
hermes_json``), and :func:`stepspec.workflows.agents.toolcalls.parser_class` finds it through
vLLM's own plug-in loading where no engine runs in the process (engines behind ``--target-url``).

Each is registered lazily: its module is imported only when a request asks for it.
"""

from __future__ import annotations

# name -> (module, class) of each parser stepspec adds to vLLM's registry
PARSERS = {"hermes_json": ("stepspec.workflows.agents.tool_parser", "HermesJsonToolParser")}


def register() -> None:
    """vLLM general-plugin hook: put stepspec's tool parsers in vLLM's registry (lazily; once)."""
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    for name, (module, cls) in PARSERS.items():
        if name not in ToolParserManager.tool_parsers and name not in ToolParserManager.lazy_parsers:
            ToolParserManager.register_lazy_module(name, module, cls)
