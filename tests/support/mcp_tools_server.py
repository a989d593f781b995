"""A small MCP stdio server for the tests: two arithmetic tools and one that kills the server.

    python tests/support/mcp_tools_server.py            # serves on stdin/stdout
"""

import os

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("arithmetic")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@server.tool()
def crash() -> str:
    """End the server's process at once (a server that dies mid-run)."""
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
