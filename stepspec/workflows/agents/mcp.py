"""Tools of an MCP server: a stdio server stepspec starts, lists and stops, its tools as any other.

    from stepspec.workflows.agents.mcp import MCPServer

    async with MCPServer("files", ["python", "my_server.py"]) as server:
        agent = Agent(reasoner, tools=server.tools)
        result = await agent.arun("...")

An MCP server declares each tool as a name, a description and a JSON schema of its
arguments: the OpenAI function schema stepspec declares every tool with. A tool is
side-effect free (may run as soon as the draft writes the call) when the server marks
it ``readOnlyHint``, or when the caller names it so. A call runs on the server within
the tool's timeout; a server that dies mid-run answers every later call with an
observation saying so (the agent goes on), and :meth:`MCPServer.start` of a server
that cannot start raises :class:`MCPServerError` naming the command and its last words.

The session lives in a task of its own (the ``mcp`` package's streams belong to the
task that opened them), which calls are handed to.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from typing import Any, Sequence

from stepspec.workflows.agents.tools import DEFAULT_TIMEOUT, Tool, ToolError

START_TIMEOUT = 30.0


class MCPServerError(ToolError):
    """An MCP server could not be started, or stopped answering."""


class MCPServer:
    """A stdio MCP server: ``command`` (the program and its arguments) started by :meth:`start`,
    its tools in :attr:`tools`, stopped by :meth:`close`. ``side_effect_free``: tool names
    that may run speculatively (beside those the server marks read-only); ``timeout``: each
    call's limit in seconds."""

    def __init__(self, name: str, command: Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: str | None = None, side_effect_free: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT,
                 start_timeout: float = START_TIMEOUT) -> None:
        if not command:
            raise MCPServerError(f"MCP server '{name}': the command is empty; give the program and its arguments")
        self.name, self.command, self.env, self.cwd = name, list(command), env, cwd
        self.side_effect_free, self.timeout, self.start_timeout = set(side_effect_free), timeout, start_timeout
        self.tools: list[Tool] = []
        self._calls: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._died: str | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")

    async def start(self) -> list[Tool]:
        """Start the server and list its tools (once); :class:`MCPServerError` if it cannot."""
        if self._task is not None:
            return self.tools
        self._calls = asyncio.Queue()
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._serve(ready))
        try:
            listed = await asyncio.wait_for(asyncio.shield(ready), self.start_timeout)
        except Exception as e:
            why = (f"did not answer within {self.start_timeout:g} s" if isinstance(e, asyncio.TimeoutError)
                   else f"failed to start: {e}")
            message = (f"MCP server '{self.name}' ({' '.join(self.command)}) {why}{self._last_words()}. Check that "
                       "the command runs on its own and speaks MCP on stdin/stdout")
            await self.close()
            raise MCPServerError(message) from None
        unknown = self.side_effect_free - {t.name for t in listed}
        if unknown:
            await self.close()
            raise MCPServerError(f"MCP server '{self.name}': side_effect_free names {sorted(unknown)}, which it does "
                                 f"not list (its tools: {', '.join(t.name for t in listed)})")
        self.tools = [self._tool(t) for t in listed]
        return self.tools

    def _tool(self, listed: Any) -> Tool:
        annotations = listed.annotations
        read_only = bool(annotations is not None and annotations.read_only_hint)

        async def call(**arguments: Any) -> Any:
            return await self.call(listed.name, arguments)

        schema = dict(listed.input_schema or {"type": "object", "properties": {}})
        schema.pop("title", None)
        return Tool(listed.name, call, (listed.description or "").strip(),
                    side_effect_free=read_only or listed.name in self.side_effect_free, timeout=self.timeout,
                    schema=schema)

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """One call on the server: its text (or structured) result; raises if the tool reports
        an error or the server died (a :class:`Tool` turns either into the agent's observation)."""
        if self._died is not None or self._task is None or self._task.done():
            raise MCPServerError(f"MCP server '{self.name}' is not running ({self._died or 'never started'})")
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        await self._calls.put((tool, arguments, answer))
        result = await answer
        text = "\n".join(getattr(c, "text", "") or json.dumps(c.model_dump(mode="json")) for c in result.content)
        if result.is_error:
            raise RuntimeError(text or f"{tool} reported an error")
        if not text and result.structured_content is not None:
            return result.structured_content
        return text

    async def _serve(self, ready: asyncio.Future) -> None:
        """The session's own task: open it, list the tools, then run the calls handed over."""
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=self.command[0], args=self.command[1:],
                                       env={**os.environ, **(self.env or {})}, cwd=self.cwd)
        pending: asyncio.Future | None = None
        try:
            async with stdio_client(params, errlog=self._stderr) as streams, \
                    ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                listed = (await session.list_tools()).tools
                ready.set_result(listed)
                while (item := await self._calls.get()) is not None:
                    tool, arguments, pending = item
                    try:
                        pending.set_result(await session.call_tool(tool, arguments))
                    except Exception as e:  # the call's failure goes to its caller
                        if not pending.done():
                            pending.set_exception(MCPServerError(f"MCP server '{self.name}': {type(e).__name__}: {e}"))
                    pending = None
        except Exception as e:  # the server could not start, or died: every caller hears why
            self._died = f"it stopped: {type(e).__name__}: {e}{self._last_words()}"
            for future in (ready, pending):
                if future is not None and not future.done():
                    future.set_exception(MCPServerError(f"MCP server '{self.name}': {self._died}"))
        finally:
            self._died = self._died or "it was closed"
            while self._calls is not None and not self._calls.empty():
                item = self._calls.get_nowait()
                if item is not None and not item[2].done():
                    item[2].set_exception(MCPServerError(f"MCP server '{self.name}': {self._died}"))

    def _last_words(self) -> str:
        """What the server wrote to stderr last (its error, if it failed)."""
        if self._stderr.closed:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        lines = [line for line in self._stderr.read().splitlines() if line.strip()]
        return f"; its stderr ends: {' | '.join(lines[-3:])}" if lines else ""

    async def close(self) -> None:
        """Stop the server (idempotent)."""
        if self._task is not None and not self._task.done():
            await self._calls.put(None)
            done, _ = await asyncio.wait({self._task}, timeout=10)
            if not done:  # a server that does not stop on stdin's end: its task (and process) cancelled
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        if not self._stderr.closed:
            self._stderr.close()

    async def __aenter__(self) -> "MCPServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
