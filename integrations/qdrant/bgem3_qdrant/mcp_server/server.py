"""The tools behind the MCP SDK's low-level `Server`: `tools/list` and `tools/call`, stdio or streamable HTTP.

The low-level server (not MCPServer) so that each schema is the one `tools.py` writes and every refusal is
one line of our own (MCPServer prefixes its text and validates with pydantic, whose messages run over
several lines). The encoder loads on a thread while the server already answers: `tools/list` needs no
model, and a client's start-up timeout is not spent on TensorFlow; a tool call waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel import Server

from bgem3_embeddings.cli_support import CommandError

from ..errors import BGEM3QdrantError
from ..ui.errors import one_line
from .tools import McpTools, tool_specs
from .wire import ProtocolStdout

logger = logging.getLogger(__name__)
SERVER_NAME = "bgem3-qdrant"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bgem3-qdrant")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


def error_result(message: str) -> types.CallToolResult:
    """A tool error (`isError`): one line a model or a person can act on."""
    text = types.TextContent(type="text", text=one_line(message))
    return types.CallToolResult(content=[text], is_error=True)


def run_tool(tools: McpTools, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
    """One tool call; every expected failure becomes a tool error and the server keeps running."""
    try:
        texts = tools.call(name, arguments)
    except (BGEM3QdrantError, CommandError) as e:  # bad input, collection, model, busy store, encoder server
        return error_result(str(e))
    except Exception as e:  # a bug: its traceback on stderr, one line to the client
        logger.exception("tool %r failed", name)
        return error_result(f"{name} failed unexpectedly ({type(e).__name__}: {e}); see the server's log")
    return types.CallToolResult(content=[types.TextContent(type="text", text=t) for t in texts])


def build_server(
    tools: Future[McpTools], *, default_collection: str, read_only: bool, instructions: str | None = None
) -> Server[Any]:
    """The MCP server. `tools` resolves once the encoder is loaded (or fails with the reason it could not)."""
    listed = [
        types.Tool(
            name=s.name,
            title=s.title,
            description=s.description,
            input_schema=s.input_schema,
            annotations=types.ToolAnnotations(
                # store under an earlier source replaces that text's chunks: destructive, yet idempotent
                title=s.title, read_only_hint=s.read_only, destructive_hint=not s.read_only,
                idempotent_hint=True, open_world_hint=False,
            ),  # fmt: skip
        )
        for s in tool_specs(default_collection, read_only)
    ]

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    def call(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        try:
            ready = tools.result()  # waits while the encoder loads
        except Exception as e:
            return error_result(f"the encoder could not be loaded: {e}")
        return run_tool(ready, name, arguments)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await anyio.to_thread.run_sync(call, params.name, params.arguments)

    return Server(
        SERVER_NAME,
        version=_version(),
        instructions=instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def load_in_background(build: Callable[[], McpTools], log_failure: bool = True) -> Future[McpTools]:
    """`build()` on a daemon thread; its result (or its exception, said once on stderr) in the future."""
    import threading

    future: Future[McpTools] = Future()

    def work() -> None:
        try:
            future.set_result(build())
        except BaseException as e:  # noqa: BLE001 - handed to every tool call (or to the command)
            if log_failure:
                logger.error("the encoder could not be loaded: %s", one_line(str(e)))
            future.set_exception(e)

    threading.Thread(target=work, name="bgem3-mcp-load", daemon=True).start()
    return future


def serve_stdio(server: Server[Any], wire: ProtocolStdout) -> None:
    """Serve one client over stdin / the protocol's stdout until stdin closes."""
    from mcp.server.stdio import stdio_server

    async def main() -> None:
        async with stdio_server(stdout=wire.stream()) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(main)
