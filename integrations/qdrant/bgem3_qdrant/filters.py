"""Payload filters: `{key: value}` dicts and CLI `key=value` pairs as the package's neutral `Filter`.

`Filter` is plain data, so that opening an embedded store and searching it never imports qdrant-client
(a second of start-up: what a search through `bgem3 serve` would otherwise spend before its first byte).
Each store engine translates it; a qdrant-client `models.Filter` is accepted wherever a filter is and
passed through (to a server as is, to Qdrant Edge translated).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from .payload import DOC_ID, metadata_path

if TYPE_CHECKING:
    from qdrant_client import models


@dataclass(frozen=True)
class FieldMatch:
    """One condition on payload field `key`: equals `value`, equals one of `any`, or `is_empty`."""

    key: str
    value: str | int | None = None
    any: tuple[str | int, ...] | None = None
    is_empty: bool | None = None


@dataclass(frozen=True)
class Filter:
    """Points matching every `must` condition and none of the `must_not` ones."""

    must: tuple[FieldMatch, ...] = ()
    must_not: tuple[FieldMatch, ...] = ()


# What a store takes: the neutral Filter, or a qdrant-client models.Filter someone wrote.
StoreFilter = Union[Filter, "models.Filter"]
FilterLike = Union[Mapping[str, Any], Filter, "models.Filter", None]


def is_qdrant_filter(flt: Any) -> bool:
    """A qdrant-client `models.Filter` (told apart without importing qdrant-client)."""
    return type(flt).__name__ == "Filter" and type(flt).__module__.startswith("qdrant_client")


def build_filter(flt: FilterLike) -> StoreFilter | None:
    """A filter from {key: value} (all must match; a list value matches any of its items).

    Keys that are not ingestion's own payload fields refer to metadata ("lang" -> "metadata.lang").
    A `Filter` or a qdrant-client `models.Filter` passes through.
    """
    if flt is None or isinstance(flt, Filter) or is_qdrant_filter(flt):
        return flt  # type: ignore[return-value]
    if not isinstance(flt, Mapping):
        raise ValueError(f"a filter is a dict or a qdrant-client models.Filter, not {type(flt).__name__}")
    conds: list[FieldMatch] = []
    for key, value in flt.items():
        check_filter_value(key, value)
        if isinstance(value, list | tuple | set):
            conds.append(FieldMatch(metadata_path(key), any=tuple(value)))
        else:
            conds.append(FieldMatch(metadata_path(key), value=value))
    return Filter(must=tuple(conds)) if conds else None


def _is_keyword_or_integer(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def check_filter_value(key: str, value: Any) -> None:
    """ValueError unless `value` is a string, an integer, or a non-empty list of strings or of integers
    (what a keyword or integer match takes; Qdrant refuses a list mixing both)."""
    if _is_keyword_or_integer(value):
        return
    if isinstance(value, list | tuple | set) and value:
        items = list(value)
        if all(isinstance(v, str) for v in items) or all(
            _is_keyword_or_integer(v) and not isinstance(v, str) for v in items
        ):
            return
    raise ValueError(
        f"filter {key}={json.dumps(value, default=str)} (--filter): a value must be a string, an integer, or "
        'a list of strings or of integers, e.g. lang=fr, year=2020 or lang=["fr","de"]'
    )


def parse_filter_args(items: Sequence[str]) -> dict[str, Any]:
    """CLI `key=value` pairs as a filter dict; values are JSON when they parse (2020, ["a","b"]), else text.

    A value that opens a JSON list or object but does not parse (`lang=[fr`) is refused, not matched as
    text; so is any value that is not a string, an integer or a list of one of them.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"filter {item!r} (--filter) is not key=value, e.g. lang=fr")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as e:
            if raw.lstrip()[:1] in ("[", "{"):
                raise ValueError(
                    f"filter {item!r} (--filter): the value is not valid JSON ({e.msg}, column {e.colno}); "
                    'quote a list like lang=\'["fr","de"]\''
                ) from e
            value = raw
        if isinstance(value, float | bool) or value is None:  # keyword/integer matches: the text as given
            value = raw
        check_filter_value(key.strip(), value)
        out[key.strip()] = value
    return out


def doc_filter(doc_ids: Sequence[str]) -> Filter:
    """Points of these documents (payload `doc_id`)."""
    return Filter(must=(FieldMatch(DOC_ID, any=tuple(doc_ids)),))


def key_present_filter(key: str) -> Filter:
    """Points that have a value under filter key `key` (a top-level field, or `metadata.<key>`)."""
    return Filter(must_not=(FieldMatch(metadata_path(key), is_empty=True),))


def to_qdrant_filter(flt: StoreFilter | None) -> models.Filter | None:
    """The qdrant-client form of a filter (for a server or local mode, which import qdrant-client anyway)."""
    if flt is None or not isinstance(flt, Filter):
        return flt
    from qdrant_client import models

    def cond(c: FieldMatch) -> models.FieldCondition:
        if c.any is not None:
            # check_filter_value let in only all-string or all-integer lists
            return models.FieldCondition(key=c.key, match=models.MatchAny(any=list(c.any)))  # type: ignore[arg-type]
        if c.is_empty is not None:
            return models.FieldCondition(key=c.key, is_empty=c.is_empty)
        return models.FieldCondition(key=c.key, match=models.MatchValue(value=c.value))  # type: ignore[arg-type]

    return models.Filter(
        must=[cond(c) for c in flt.must] or None, must_not=[cond(c) for c in flt.must_not] or None
    )
