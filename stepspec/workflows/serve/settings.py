"""``stepspec serve``'s settings, declared once: the command line's flags come from them."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from stepspec.workflows.agents.toolcalls import DEFAULT_TOOL_CALL_PARSER


class ServeSettings(BaseModel):
    """Where the server listens and how it admits requests (``stepspec serve``'s flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="Address to bind (127.0.0.1: this machine only).")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on.")
    api_key_env: str | None = Field(None, description="Environment variable holding the key clients must send as "
                                    "'Authorization: Bearer <key>' (401 otherwise); unset: no key.")
    max_concurrency: int = Field(64, ge=1, description="Traces in flight at once; beyond it a 429 with Retry-After.")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Largest request body accepted (413 beyond).")
    retry_after_s: int = Field(2, ge=1, description="Seconds a 429 asks the client to wait.")
    tool_call_parser: str = Field(DEFAULT_TOOL_CALL_PARSER, description="How a served model's tool calls are read: "
                                  "a name in vLLM's tool-parser registry (hermes, mistral, ...; hermes_json: hermes "
                                  "tags or fenced JSON blocks, as the bundled pair writes them).")
    constrained_calls: bool | None = Field(None, description="Whether calls are generated bound to the declared "
                                           "tools' schemas (vLLM's structured outputs): unset, where stepspec knows "
                                           "how the parser's calls open (hermes_json, hermes); true: there, or an "
                                           "error; false: never (calls are checked after they are written).")
    call_guidance: bool = Field(False, description="Whether a request with tools (tool_choice auto) has its system "
                                "message say to write a call for each item asked for and none where no tool fits "
                                "(stepspec.workflows.agents.toolcalls.SEVERAL_CALLS, NO_FITTING_CALL); off: the "
                                "messages as sent.")
    disconnect_poll_s: float = Field(0.25, gt=0, description="How often a non-streaming request checks that its "
                                     "client is still there.")

    def api_key(self) -> str | None:
        """The key clients must send, read from ``api_key_env``; a clear error if it is unset."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ValueError(f"--api-key-env {self.api_key_env}: the environment variable is not set (or empty); "
                             f"export {self.api_key_env}=<key> first")
        return key
