"""Moved to :mod:`workflows.agents.tools`; this name stays so tool modules written as
``from workflows.tools import tool`` keep working."""

from workflows.agents.tools import Tool, ToolResult, as_tool, load_tool, tool  # noqa: F401
