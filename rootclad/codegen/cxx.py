"""The one way text that came from a user or a file (a path, a name from an ONNX file or a torch
module, a column) reaches generated C++: as a string literal or a comment that holds exactly
that text, whatever its characters, and never becomes code. Identifiers in generated code are
made by the emitters from positions and op names (``a_linear_3``), never from such text."""

from __future__ import annotations

import os
import re


def string_literal(text: str) -> str:
    """``text`` as a C++ string literal of its bytes as the file system has them (UTF-8, or
    the original bytes of an undecodable name); each byte that is not printable ASCII, and
    ``"``, ``\\`` and ``?`` (trigraphs), as a three-digit octal escape."""

    def char(b: int) -> str:
        return chr(b) if 32 <= b < 127 and chr(b) not in '"\\?' else f"\\{b:03o}"

    return '"' + "".join(map(char, os.fsencode(text))) + '"'


def comment_text(text: str) -> str:
    """``text`` for a comment (``//`` or ``/* */``): printable ASCII but for ``\\`` and ``?``
    as it is; those two, every other character (newlines, control characters, undecodable
    bytes, non-ASCII) and the ``/`` of ``*/`` or ``/*`` as ``\\x..``, ``\\u....`` escapes.
    The result is one line, ends no line with a backslash (a continuation), holds no trigraph
    (``??/``) and cannot close or open a block comment."""
    out = "".join(c if " " <= c <= "~" and c not in "\\?" else _escape(c) for c in text)
    return re.sub(r"(?<=\*)/|/(?=\*)", r"\\x2f", out)


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


# A name given to generated C++ (``rootclad emit``'s namespace) is none of these.
KEYWORDS = frozenset(
    """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class co_await co_return co_yield compl concept const const_cast consteval constexpr
    constinit continue decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not
    not_eq nullptr operator or or_eq private protected public register reinterpret_cast requires
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void
    volatile wchar_t while xor xor_eq
""".split()
)


def number(value) -> str:
    """A Python number as a C++ literal that reads back as the same double (or int); an
    infinity as HUGE_VAL (<cmath>), never a NaN."""
    if isinstance(value, bool) or isinstance(value, int):
        return str(int(value))
    text = repr(float(value))
    if text in ("inf", "-inf"):
        return text.replace("inf", "HUGE_VAL")
    if text == "nan":
        raise ValueError(f"{value!r} has no C++ literal; rootclad refuses it before emitting")
    return text


def functor_value(node) -> str:
    """The C++ value of an elementwise op's functor (include/rootclad/ops/activations.h), its
    arguments from the node's attrs: ``::rootclad::LeakyRelu{0.01}``."""
    from rootclad.ir.registry import OPS

    spec = OPS[node.op]
    args = ", ".join(number(a) for a in spec.functor_args(node.attrs))
    return f"::rootclad::{spec.functor}{{{args}}}"
