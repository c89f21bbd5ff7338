"""The one error type of ``rootclad.data``: bad input, named precisely."""

from __future__ import annotations

import re

_WHERE = re.compile(
    r"^(?P<file>.*?): (?:tree '(?P<tree>[^']*)')?(?:, )?(?:branch '(?P<branch>[^']*)')?"
    r"(?:, )?(?:entry (?P<entry>\d+))?: (?P<what>.*)$",
    re.S,
)


class DataError(RuntimeError):
    """A problem with the input data, naming the file, tree, branch and entry where known.

    The message reads ``<file>: tree '<tree>', branch '<branch>', entry <n>: <what>``;
    the parts are also attributes (``None`` where they do not apply).
    """

    def __init__(self, what: str, *, file=None, tree=None, branch=None, entry=None):
        self.what = what
        self.file = None if file is None else str(file)
        self.tree = tree
        self.branch = branch
        self.entry = entry
        where = []
        if tree is not None:
            where.append(f"tree '{tree}'")
        if branch is not None:
            where.append(f"branch '{branch}'")
        if entry is not None:
            where.append(f"entry {entry}")
        head = self.file or "rootclad.data"
        if where:
            head += ": " + ", ".join(where)
        super().__init__(f"{head}: {what}")

    @classmethod
    def from_message(cls, message: str) -> DataError:
        """Rebuild the error from a message in the format above (as the C++ reader throws)."""
        m = _WHERE.match(message.strip())
        if not m or not (m["tree"] or m["branch"] or m["entry"]):
            head, sep, what = message.strip().partition(": ")
            if sep and head and not head.startswith("rootclad"):
                return cls(what, file=head)
            return cls(message.strip())
        entry = int(m["entry"]) if m["entry"] is not None else None
        return cls(m["what"], file=m["file"], tree=m["tree"], branch=m["branch"], entry=entry)
