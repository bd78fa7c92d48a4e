"""A job reference (a name, an id or its prefix) as the command line hands it over."""

from __future__ import annotations


def as_typed(ref: str) -> str:
    """A reference as the user typed it, for one line: undecodable bytes as \\xNN, cut."""
    raw = ref[:60].encode("utf-8", "surrogateescape" if encodable(ref, "surrogateescape")
                          else "backslashreplace")  # fmt: skip
    text = raw.decode("utf-8", "backslashreplace")
    return ("'" + text + "'" if text.isprintable() else repr(text)) + ("..." * (len(ref) > 60))


def encodable(text: str, errors: str = "strict") -> bool:
    """Text SQLite can take: a command line's undecodable bytes arrive as lone surrogates."""
    try:
        text.encode("utf-8", errors)
    except UnicodeEncodeError:
        return False
    return True
