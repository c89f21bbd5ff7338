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
