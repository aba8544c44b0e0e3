"""The options of `bgem3-qdrant mcp` besides the store and the encoder, and the texts they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from bgem3_embeddings.install_hint import pip_install

Transport = Literal["stdio", "streamable-http"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)
INSTALL = pip_install("bgem3-qdrant[mcp]")
KEY_OPTION = "--mcp-api-key KEY (or BGEM3_MCP_API_KEY)"
INSTRUCTIONS = (
    "Search the user's own documents with `find` (hybrid by default; rerank is the most precise), cite each "
    "passage's source and chunk_index, use `explain` to see why a passage matched, `collections` to see what "
    "is stored and which metadata keys `find` can filter on."
)


@dataclass(frozen=True)
class McpOptions:
    """The command's options besides the store and the encoder."""

    collection: str = "documents"
    transport: str = "stdio"
    read_only: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    insecure_no_auth: bool = False
    allowed_hosts: tuple[str, ...] = ()
    log_level: str = "warning"
