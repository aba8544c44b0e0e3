"""Numbers said in words: `1 file`, `2 files`, `1,200 chunks`; sizes in KiB / MiB / GiB."""

from __future__ import annotations


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """`n` and the noun in the form that number takes.

    >>> counted(1, "file"), counted(0, "chunk"), counted(1200, "chunk"), counted(2, "query", "queries")
    ('1 file', '0 chunks', '1,200 chunks', '2 queries')
    """
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"


def size_in_bytes(n: int) -> str:
    """`512 bytes`, `1.5 KiB`, `3.2 MiB`, `1.1 GiB`.

    >>> size_in_bytes(512), size_in_bytes(1536), size_in_bytes(3 * 1024**3)
    ('512 bytes', '1.5 KiB', '3.0 GiB')
    """
    if n < 1024:
        return counted(n, "byte")
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"
