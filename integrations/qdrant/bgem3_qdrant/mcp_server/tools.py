"""The four MCP tools: what an LLM reads about each (description, JSON schema) and what each does.

Nothing here imports the MCP SDK: a tool takes the arguments a client sent (a dict) and returns its text
contents (a list of str), or raises ToolInputError / a BGEM3QdrantError with one line to show. `server.py`
turns both into protocol messages. The work is the package's own: `find` is `StoreSession.search_mode`
(the Searcher calls of `bgem3-qdrant search`), its hits are `hit_record` (the lines of `search --json`),
`explain` renders the encoder's explanation as `search --explain` does, `store` is an `Ingestor` run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from bgem3_embeddings.concurrency import encoder_lock
from bgem3_embeddings.explain.render import render
from bgem3_embeddings.query_text import query_cut_note
from bgem3_embeddings.scoring import DEFAULT_MODE_WEIGHTS

from ..errors import BGEM3QdrantError
from ..ids import content_hash
from ..ingest import IngestOptions, Ingestor
from ..schema import CollectionSchema
from ..search import EXPLAIN_TOP, hit_record
from ..sources import Document
from ..stores.base import MODES, Mode
from ..ui.session import MAX_LIMIT, MAX_PASSAGE_CHARS, MAX_QUERY_CHARS, StoreSession, check_text

FIND, EXPLAIN, COLLECTIONS, STORE = "find", "explain", "collections", "store"
DEFAULT_MODE: Mode = "hybrid"
DEFAULT_K = 5  # `bgem3-qdrant search`'s --limit
# A stored text without a source gets this prefix and its hash as document id: the same text, the same ids.
STORED_PREFIX = "mcp:"


class ToolInputError(BGEM3QdrantError):
    """Arguments a tool cannot use (the message says which and what to send)."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool as `tools/list` shows it."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool


def _collection_prop(default: str) -> dict[str, Any]:
    return {
        "type": "string",
        "description": f"Collection to use (default {default!r}; the `collections` tool lists them).",
    }


def tool_specs(default_collection: str, read_only: bool) -> list[ToolSpec]:
    """The tools this server offers: `store` only when it may write."""
    query = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_QUERY_CHARS,
        "description": "What to look for, in any language, as a question or keywords.",
    }
    specs = [
        ToolSpec(
            FIND,
            "Find passages",
            "Search the user's documents (BGE-M3: dense meaning, sparse exact words, ColBERT token "
            "matching) and return the best passages. Each result is one text content holding a JSON object: "
            "id, score, scores per stage, text, source, doc_id, chunk_index, metadata; cite source and "
            "chunk_index when you use a passage. Modes: hybrid (default: dense + sparse fused with RRF, "
            "good for most questions), rerank (hybrid candidates reordered by ColBERT, most precise, a "
            "little slower), dense (meaning only), sparse (exact words: names, codes, rare terms). Narrow "
            "with filters on metadata keys the `collections` tool lists.",
            {
                "type": "object",
                "properties": {
                    "query": query,
                    "collection": _collection_prop(default_collection),
                    "mode": {"type": "string", "enum": list(MODES), "default": DEFAULT_MODE,
                             "description": "Search mode (see the tool description)."},  # fmt: skip
                    "k": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_K,
                          "description": "Number of passages to return."},  # fmt: skip
                    "filters": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": 'Metadata filters, each "key=value" (all must match), e.g. "lang=fr", '
                        '"year=2020", or a JSON list for any of several values: \'lang=["fr","de"]\'.',
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
            read_only=True,
        ),
        ToolSpec(
            EXPLAIN,
            "Explain a result",
            "Why a passage `find` returned matches the query: its dense, sparse and ColBERT scores, the "
            "query words it shares with the passage (sparse terms) and which passage tokens each query "
            "token aligned with (ColBERT). Give the query and the result's id.",
            {
                "type": "object",
                "properties": {
                    "query": query,
                    "id": {"type": "string", "description": "The `id` of a result of `find`."},
                    "collection": _collection_prop(default_collection),
                },
                "required": ["query", "id"],
                "additionalProperties": False,
            },
            read_only=True,
        ),
        ToolSpec(
            COLLECTIONS,
            "List collections",
            "The collections of the store: chunks, the model that wrote them, precision, ColBERT pooling, "
            "the metadata keys `find` can filter on (with example key=value pairs), and why one cannot be "
            "searched (problem) if so. One JSON object per collection.",
            {"type": "object", "properties": {}, "additionalProperties": False},
            read_only=True,
        ),
    ]
    if not read_only:
        specs.append(
            ToolSpec(
                STORE,
                "Store a text",
                "Remember a text in the user's documents so that `find` returns it later: it is chunked and "
                "stored with dense, sparse and ColBERT vectors. Storing the same text again adds nothing. "
                "With `source`, a later store under the same source replaces that text (its old chunks are "
                "removed). Metadata values (strings or integers) can be filtered on by `find`.",
                {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "minLength": 1, "maxLength": MAX_PASSAGE_CHARS,
                                 "description": "The text to store."},  # fmt: skip
                        "metadata": {
                            "type": "object",
                            "description": 'Metadata of the text, e.g. {"lang": "en", "topic": "notes"}.',
                        },
                        "source": {
                            "type": "string",
                            "description": "Where the text comes from (a name to cite; also its document "
                            "id). Default: mcp:<hash of the text>.",
                        },
                        "collection": _collection_prop(default_collection),
                    },
                    "required": ["text"],
                    "additionalProperties": False,
                },
                read_only=False,
            )
        )
    return specs


def _get(args: Mapping[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """An argument of the expected JSON type, or ToolInputError naming it."""
    value = args.get(name, default)
    if value is None or (kind is int and isinstance(value, bool)):
        if value is None:
            return default
    elif isinstance(value, kind):
        return value
    json_type = {str: "a string", int: "an integer", list: "an array", dict: "an object"}[kind]
    raise ToolInputError(f"argument {name!r} must be {json_type}, got {json.dumps(value)[:60]}")


def _text(value: Any, name: str, limit: int) -> str:
    """`check_text` (a non-empty str), its length limit said as this tool's rather than the page's."""
    if isinstance(value, str) and len(value) > limit:
        size = f"{len(value):,} characters"
        raise ToolInputError(f"the {name} has {size}, over the limit of {limit:,}: shorten it")
    return check_text(value, name, limit)


class McpTools:
    """The tools over one store session. `model_id` is recorded with what `store` writes."""

    def __init__(
        self,
        session: StoreSession,
        *,
        default_collection: str,
        model_id: str,
        read_only: bool = False,
        ingest_options: IngestOptions | None = None,
    ) -> None:
        self.session = session
        self.default_collection = default_collection
        self.model_id = model_id
        self.read_only = read_only
        self.ingest_options = ingest_options or IngestOptions(show_progress=False)
        self.specs = {s.name: s for s in tool_specs(default_collection, read_only)}
        self._handlers: dict[str, Callable[[Mapping[str, Any]], list[str]]] = {
            FIND: self.find,
            EXPLAIN: self.explain,
            COLLECTIONS: self.collections,
            STORE: self.store,
        }

    def call(self, name: str, arguments: Mapping[str, Any] | None) -> list[str]:
        """Run tool `name`; ToolInputError for an unknown tool or arguments it does not take."""
        spec = self.specs.get(name)
        if spec is None:
            offered = ", ".join(self.specs)
            why = " (the server runs with --read-only)" if name == STORE else ""
            raise ToolInputError(f"no tool {name!r}{why}; the tools are {offered}")
        args = dict(arguments or {})
        unknown = sorted(set(args) - set(spec.input_schema["properties"]))
        if unknown:
            raise ToolInputError(
                f"{name} takes no argument {', '.join(map(repr, unknown))}; it takes "
                f"{', '.join(spec.input_schema['properties'])}"
            )
        return self._handlers[name](args)

    def _collection(self, args: Mapping[str, Any]) -> str:
        name = _get(args, "collection", str, self.default_collection)
        if not name.strip():
            raise ToolInputError("argument 'collection' is empty: give a name the `collections` tool lists")
        return str(name)

    def find(self, args: Mapping[str, Any]) -> list[str]:
        query = _text(args.get("query"), "query", MAX_QUERY_CHARS)
        mode = _get(args, "mode", str, DEFAULT_MODE)
        if mode not in MODES:
            raise ToolInputError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        k = _get(args, "k", int, DEFAULT_K)
        if not 1 <= k <= MAX_LIMIT:  # said as this tool's argument, not the page's `limit`
            raise ToolInputError(f"argument 'k' must be between 1 and {MAX_LIMIT}, got {k}")
        filters = _get(args, "filters", list, [])
        if not all(isinstance(f, str) for f in filters):
            raise ToolInputError('argument \'filters\' must be an array of "key=value" strings')
        collection = self._collection(args)
        hits, missing = self.session.search_mode(collection, query, cast(Mode, mode), k, filters)
        out = [json.dumps(hit_record(query, h), ensure_ascii=False) for h in hits]
        if not hits:
            out.append(f"no passage of {collection!r} matches (mode {mode})")
        out += [
            f"warning: no point of {collection!r} has the filter key {key!r}; the search ran but cannot "
            "match it (the `collections` tool lists the metadata keys)"
            for key in missing
        ]
        cut = query_cut_note(self.session.encoder, query)  # the hits answer the query's first tokens only
        return out + ([f"warning: {cut}"] if cut else [])

    def explain(self, args: Mapping[str, Any]) -> list[str]:
        query = _text(args.get("query"), "query", MAX_QUERY_CHARS)
        point_id = _get(args, "id", str)
        if not point_id:
            raise ToolInputError("argument 'id' is missing: give the id of a result of `find`")
        collection = self._collection(args)
        passage, hit = self.session.stored_chunk(collection, point_id)
        encoder = self.session.encoder
        with encoder_lock(encoder):
            explanation = encoder.explain_many(query, [passage], weights=DEFAULT_MODE_WEIGHTS)[0]
        head = f"{hit['id']}: {hit['doc_id'] or hit['source']} #{hit['chunk_index']}"
        lines = render(explanation, top_terms=EXPLAIN_TOP, top_matches=EXPLAIN_TOP)
        return ["\n".join([head, *lines])]

    def collections(self, args: Mapping[str, Any]) -> list[str]:
        found = self.session.collections()
        if not found:
            return [f"the {self.session.target.describe()} holds no collection yet"]
        return [json.dumps(c, ensure_ascii=False) for c in found]

    def store(self, args: Mapping[str, Any]) -> list[str]:
        if self.read_only:  # not listed then; a client that calls it anyway is told why
            raise ToolInputError("this server runs with --read-only: it stores nothing")
        text = _text(args.get("text"), "text", MAX_PASSAGE_CHARS)
        metadata = _get(args, "metadata", dict, {})
        source = _get(args, "source", str) or None
        collection = self._collection(args)
        doc_id = source or f"{STORED_PREFIX}{content_hash(text)[:32]}"
        doc = Document(doc_id=doc_id, source=source or doc_id, text=text, metadata=dict(metadata))
        encoder = self.session.encoder
        with self.session.opened() as store, encoder_lock(encoder):
            ingestor = Ingestor(
                store,
                collection,
                encoder,
                schema=CollectionSchema(size=int(encoder.hidden_size)),
                options=self.ingest_options,
                model_id=self.model_id,
            )
            summary = ingestor.ingest_documents([doc])
        return [
            json.dumps(
                {
                    "collection": collection,
                    "doc_id": doc_id,
                    "chunks": summary.chunks,
                    "written": summary.encoded,
                    "unchanged": summary.unchanged,
                    "removed": summary.pruned,
                },
                ensure_ascii=False,
            )
        ]
