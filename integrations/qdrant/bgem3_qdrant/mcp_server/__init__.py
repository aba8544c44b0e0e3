"""`bgem3-qdrant mcp`: a store served to LLM clients over the Model Context Protocol (docs/mcp.md).

- `tools`: the four tools (find, explain, collections, store): descriptions, JSON schemas, what each does,
  on a `ui.session.StoreSession` (the store opened lazily, `Searcher`, explanations, `Ingestor`). No SDK.
- `server`: the SDK's low-level `Server` around them (`tools/list`, `tools/call`, tool errors), stdio.
- `wire`: fd 1 kept for the protocol over stdio.
- `http`: streamable HTTP behind `bgem3_embeddings.http_guard` and the bearer key.
- `options`: the command's options besides the store and the encoder.
- `command`: what the command runs (checks before anything loads, the encoder, the transport).
"""
