"""A user's text (a path, a file name) in generated C++: a string literal or a ``//`` comment
that holds exactly that text, whatever its characters, and never becomes code."""

from __future__ import annotations

import os


def string_literal(text: str) -> str:
    """``text`` as a C++ string literal of its bytes as the file system has them (UTF-8, or
    the original bytes of an undecodable name); each byte that is not printable ASCII, and
    ``"``, ``\\`` and ``?`` (trigraphs), as a three-digit octal escape."""

    def char(b: int) -> str:
        return chr(b) if 32 <= b < 127 and chr(b) not in '"\\?' else f"\\{b:03o}"

    return '"' + "".join(map(char, os.fsencode(text))) + '"'


def comment_text(text: str) -> str:
    """``text`` for a ``//`` comment: on one line, with ``\\`` and every character that is not
    printable (newlines, control characters, undecodable bytes) escaped as Python writes them."""
    return "".join(c if c.isprintable() and c != "\\" else ascii(c)[1:-1] for c in text)
