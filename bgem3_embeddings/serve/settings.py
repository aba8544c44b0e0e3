"""The server's settings: request limits, the queue, batching, auth, CORS and the Host names served (plain
data, no web framework).

    settings = ServeSettings(api_key="s3cret", max_queued_texts=1024)
    ServeSettings.from_json(settings.to_json()) == settings   # how `--workers N` hands them to each worker
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from bgem3_embeddings.http_guard import GuardRules

# The options the guard's refusals name (bgem3_embeddings/http_guard.py).
HOSTS_ENV = "BGEM3_ALLOWED_HOSTS"
HOST_OPTION = f"--allowed-host NAME (or {HOSTS_ENV})"
ORIGIN_OPTION = "--cors-origin ORIGIN"

# Bounds of the request limits, chosen so that one request cannot hold more memory than a few hundred MB:
# OpenAI's own embeddings API takes at most 2048 inputs per request (LangChain sends 1000 at a time).
DEFAULT_MAX_INPUTS = 2048
DEFAULT_MAX_CHARS = 100_000  # about 25k tokens: past the model's 8192 positions, truncated anyway
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_QUEUED_TEXTS = 4096
# Tokens of one encoder call: queued requests are taken, oldest first, until their texts hold this many
# tokens (at least one request). The encoder then length-sorts them into batches of max_tokens_per_batch.
DEFAULT_CYCLE_TOKENS = 32768
# Cells of the ColBERT similarity matrices one explain request may ask for (query vectors x passage vectors,
# summed over its passages): 2**20 is a 128-token query against an 8192-token passage, about 20 MB of JSON
# (an 8192 x 8192 pair would be 67M cells, 1.3 GB).
DEFAULT_MAX_MATRIX_CELLS = 1 << 20
# After a call that answered several requests, wait up to this share of its time for them to come back
# (batcher.py: the clients of one call return at different moments; without it calls alternate small/large).
DEFAULT_REGATHER_SHARE = 0.1


@dataclass(frozen=True)
class ServeSettings:
    """What `create_app` needs besides the encoder. Every limit is answered with a JSON error naming it.

    model_name: the id `/v1/models` lists and responses echo (None: the encoder's model_id).
    reranker_name: the id the rerank routes echo (None: the reranker's model_id).
    api_key: required as `Authorization: Bearer KEY` on every route but /health (None: no auth).
    cors_origins: origins allowed by CORS (empty: no CORS headers at all).
    bound_host: the address listened on; with no api_key only a Host naming this machine is served.
    allowed_hosts: more Host names to serve when no api_key is set (`--allowed-host`; `*`: any).
    max_inputs_per_request / max_chars_per_input / max_body_bytes: 413 beyond them.
    max_colbert_matrix_cells: `colbert_matrix: true` on /v1/bgem3/explain beyond it: 413.
    max_queued_texts: texts waiting for the encoder; a request that would exceed it gets 503 + Retry-After.
    cycle_tokens: tokens gathered from waiting requests into one encoder call.
    batch_size / max_tokens_per_batch: the encoder's batching inside a call (None: the encoder's own).
    batch_wait_ms: how long the worker waits for more requests before an encoder call (0: never; the
        queue fills by itself while a call runs, so waiting only adds latency at low load).
    regather_share: after a call that answered several requests, the worker waits up to this share of that
        call's time (at most 0.1 s) for as many requests to be queued again (0: never; a lone client never
        waits).
    """

    model_name: str | None = None
    reranker_name: str | None = None
    api_key: str | None = None
    cors_origins: tuple[str, ...] = field(default_factory=tuple)
    bound_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)
    max_inputs_per_request: int = DEFAULT_MAX_INPUTS
    max_chars_per_input: int = DEFAULT_MAX_CHARS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_colbert_matrix_cells: int = DEFAULT_MAX_MATRIX_CELLS
    max_queued_texts: int = DEFAULT_MAX_QUEUED_TEXTS
    cycle_tokens: int = DEFAULT_CYCLE_TOKENS
    batch_size: int | None = None
    max_tokens_per_batch: int | None = None
    batch_wait_ms: float = 0.0
    regather_share: float = DEFAULT_REGATHER_SHARE

    def __post_init__(self) -> None:
        for name in (
            "max_inputs_per_request",
            "max_chars_per_input",
            "max_body_bytes",
            "max_colbert_matrix_cells",
            "max_queued_texts",
            "cycle_tokens",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("batch_size", "max_tokens_per_batch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if not isinstance(self.batch_wait_ms, int | float) or self.batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms!r}")
        if not isinstance(self.regather_share, int | float) or not 0 <= self.regather_share <= 1:
            raise ValueError(f"regather_share must be between 0 and 1, got {self.regather_share!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty")
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))

    def guard_rules(self) -> GuardRules:
        """The Host / Origin / JSON rules of http_guard: the Host is checked only when no key is set."""
        return GuardRules(
            bound_host=self.bound_host,
            extra_hosts=self.allowed_hosts,
            check_host=not self.api_key,
            cors_origins=self.cors_origins,
            host_option=HOST_OPTION,
            origin_option=ORIGIN_OPTION,
        )

    def limits(self) -> dict[str, int]:
        """The request limits as `/v1/bgem3/info` reports them."""
        return {
            "max_inputs_per_request": self.max_inputs_per_request,
            "max_chars_per_input": self.max_chars_per_input,
            "max_body_bytes": self.max_body_bytes,
            "max_colbert_matrix_cells": self.max_colbert_matrix_cells,
            "max_queued_texts": self.max_queued_texts,
        }

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeSettings:
        data: dict[str, Any] = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def is_loopback(host: str) -> bool:
    """Whether binding `host` reaches only this machine (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def exposure_problem(
    host: str,
    api_key: str | None,
    insecure_no_auth: bool,
    key_option: str = "--api-key KEY (or BGEM3_API_KEY)",
) -> str | None:
    """Why serving on `host` with these options is refused (None: allowed).

    Anyone who can reach a non-loopback address can use the model (and its CPU): require a key there,
    unless the operator says explicitly that something else (a proxy, a private network) guards it.
    `key_option` names the option that sets the key (`bgem3-qdrant ui` has its own).
    """
    if is_loopback(host) or api_key or insecure_no_auth:
        return None
    return (
        f"binding {host} exposes the server beyond this machine without authentication (--host): "
        f"set {key_option}, or pass --insecure-no-auth if a proxy or private network guards it"
    )
