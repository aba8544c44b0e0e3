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
        match: models.MatchAny | models.MatchValue
        if isinstance(value, list | tuple | set):
            match = models.MatchAny(any=list(value))
        else:
            match = models.MatchValue(value=value)
        conds.append(models.FieldCondition(key=metadata_path(key), match=match))
    return models.Filter(must=conds) if conds else None


def parse_filter_args(items: Sequence[str]) -> dict[str, Any]:
    """CLI `key=value` pairs as a filter dict; values are JSON when they parse (2020, true, ["a","b"])."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"filter {item!r} is not key=value")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if isinstance(value, float | dict):  # keyword/integer matches only: keep the text as given
            value = raw
        out[key.strip()] = value
    return out


def doc_filter(doc_ids: Sequence[str]) -> models.Filter:
    """Points of these documents (payload `doc_id`)."""
    return models.Filter(must=[models.FieldCondition(key=DOC_ID, match=models.MatchAny(any=list(doc_ids)))])
