"""Payload filters: `{key: value}` dicts and CLI `key=value` pairs as qdrant `models.Filter`.

`models.Filter` is the package's neutral filter language; each store engine translates it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from qdrant_client import models

from .payload import DOC_ID, metadata_path

FilterLike = Mapping[str, Any] | models.Filter | None


def build_filter(flt: FilterLike) -> models.Filter | None:
    """A Qdrant filter from {key: value} (all must match; a list value matches any of its items).

    Keys that are not ingestion's own payload fields refer to metadata ("lang" -> "metadata.lang").
    A `models.Filter` passes through.
    """
    if flt is None or isinstance(flt, models.Filter):
        return flt
    conds: list[models.Condition] = []
    for key, value in flt.items():
        check_filter_value(key, value)
        match: models.MatchAny | models.MatchValue
        if isinstance(value, list | tuple | set):
            match = models.MatchAny(any=list(value))
        else:
            match = models.MatchValue(value=value)
        conds.append(models.FieldCondition(key=metadata_path(key), match=match))
    return models.Filter(must=conds) if conds else None


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


def doc_filter(doc_ids: Sequence[str]) -> models.Filter:
    """Points of these documents (payload `doc_id`)."""
    return models.Filter(must=[models.FieldCondition(key=DOC_ID, match=models.MatchAny(any=list(doc_ids)))])


def key_present_filter(key: str) -> models.Filter:
    """Points that have a value under filter key `key` (a top-level field, or `metadata.<key>`)."""
    return models.Filter(must_not=[models.FieldCondition(key=metadata_path(key), is_empty=True)])
