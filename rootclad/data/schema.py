"""What a model reads, stored with it: :class:`Schema` (the input columns, their lengths and
order, the target, weight and class names); :class:`rootclad.data.Standardize` (standardize.py)
is a preprocessing stage compiled into the model.

>>> it = from_rdataframe(df, features=["pt", "eta", "jets"], target="label", weight="w")
>>> net = nn.Sequential(Standardize.fit(it), nn.Linear(it.length, 16), ...)
>>> cm = rootclad.compile(net, torch.zeros(1, it.length))
>>> cm.export("build/net", schema=it.schema.replace(classes=["background", "signal"]))
>>> rootclad.root.define_score(df, "build/net")   # the columns come from the export

``cm.export(stem, schema=...)`` writes the schema into ``STEM.root``'s metadata; then
``define_score``, ``define_saliency``, ``score_tree`` and ``rootclad::Model::input_columns()``
read it, and columns given to them anyway are checked against it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import numpy as np

# A column rootclad names in C++: an identifier (a branch it writes: ROOT reads other
# characters in a branch's name as a leaf list, ``s[64]`` as 64 floats from the address of one),
# or, read through a Define expression, identifiers joined by dots (RDataFrame finds the columns
# in the text and replaces ``a.b``). Anything else could be read as code.
_IDENTIFIER = r"[A-Za-z_]\w*"
IDENTIFIER = re.compile(_IDENTIFIER, re.ASCII)
COLUMN_NAME = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*", re.ASCII)


def check_column_name(name, what: str = "column", *, dotted: bool = True) -> str:
    """``name`` when it is a column name rootclad may put in C++: with ``dotted``, a C++ name or
    such names joined by dots (a column a Define reads); without, an identifier (a branch
    rootclad writes). ValueError otherwise, starting with ``what`` and ``name``."""
    if isinstance(name, str) and (COLUMN_NAME if dotted else IDENTIFIER).fullmatch(name):
        return name
    if dotted:
        raise ValueError(
            f"{what} {name!r} is not a C++ name (letters, digits and _, or such names joined by "
            "dots); RDataFrame finds a Define's columns in the expression's text, so it cannot "
            "be used there safely: rename the branch"
        )
    raise ValueError(
        f"{what} {name!r} is not an identifier (letters, digits and _, not starting with a "
        "digit): ROOT would read other characters in a branch's name as a leaf list"
    )


@dataclasses.dataclass(frozen=True)
class Schema:
    """The input of a model as columns of a TTree or RDataFrame, in order.

    ``columns``: a mapping ``{name: values per event}``, a list of ``(name, length)`` pairs, or
    a list of names (one number each). ``target`` and ``weight`` name the columns training
    read; ``classes`` name the output's classes (``["noise", "signal"]``: class 0, 1)."""

    columns: tuple[tuple[str, int], ...]
    target: str | None = None
    weight: str | None = None
    classes: tuple[str, ...] | None = None

    def __init__(self, columns, *, target=None, weight=None, classes=None):
        if isinstance(columns, Mapping):
            pairs = list(columns.items())
        elif isinstance(columns, str):
            pairs = [(columns, 1)]
        else:
            pairs = [(c, 1) if isinstance(c, str) else tuple(c) for c in columns]
        if not pairs:
            raise ValueError("a schema needs at least one input column")
        cols = []
        for pair in pairs:
            if len(pair) != 2:
                raise ValueError(f"schema column {pair!r}: expected (name, length)")
            name, length = pair
            check_column_name(name, "input column")
            if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
                raise ValueError(f"input column {name!r}: length {length!r} is not a count >= 1")
            cols.append((name, int(length)))
        names = [n for n, _ in cols]
        if len(set(names)) != len(names):
            raise ValueError(f"input columns repeat: {names}")
        for what, name in (("target", target), ("weight", weight)):
            if name is not None:
                check_column_name(name, f"{what} column")
                if name in names:  # the answer among the inputs: a model that reads its label
                    raise ValueError(f"the {what} column {name!r} is also an input column")
        if target is not None and target == weight:
            raise ValueError(f"the target and the weight are one column, {target!r}")
        if classes is not None:
            if isinstance(classes, str) or not all(isinstance(c, str) for c in classes):
                raise ValueError(f"classes must be a list of names, got {classes!r}")
            classes = tuple(classes)
        object.__setattr__(self, "columns", tuple(cols))
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "classes", classes)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.columns]

    @property
    def lengths(self) -> list[int]:
        return [k for _, k in self.columns]

    @property
    def size(self) -> int:
        """Values per event: the model's input size."""
        return sum(self.lengths)

    def replace(self, **changes) -> Schema:
        """A copy with some fields changed: ``it.schema.replace(classes=["bkg", "sig"])``."""
        fields = {
            "columns": self.columns,
            "target": self.target,
            "weight": self.weight,
            "classes": self.classes,
        } | changes
        return Schema(fields.pop("columns"), **fields)

    def to_json(self) -> dict:
        return {
            "input_columns": self.names,
            "input_lengths": self.lengths,
            "target": self.target,
            "weight": self.weight,
            "classes": None if self.classes is None else list(self.classes),
        }

    @classmethod
    def from_json(cls, meta: dict) -> Schema | None:
        """The schema in an export's metadata, or None for an export written without one."""
        if not meta.get("input_columns"):
            return None
        return cls(
            list(zip(meta["input_columns"], meta["input_lengths"], strict=True)),
            target=meta.get("target"),
            weight=meta.get("weight"),
            classes=meta.get("classes"),
        )

    @classmethod
    def of(cls, source) -> Schema:
        """``source`` itself, or the schema of a reader (``from_rdataframe``, the iterators)."""
        if isinstance(source, Schema):
            return source
        schema = getattr(source, "schema", None)
        if isinstance(schema, Schema):
            return schema
        raise TypeError(
            f"expected a rootclad.data.Schema or a reader with .schema, got {type(source).__name__}"
        )


def check_schema(
    schema: Schema,
    input_size: int,
    what: str,
    *,
    outputs: int | None = None,
    class_index: bool = False,
) -> Schema:
    """``schema`` against the model: its columns hold the input size; its class names, if any,
    name the model's classes (``outputs`` of a class-index loss, or 2 for one logit)."""
    if schema.size != input_size:
        detail = ", ".join(f"{n} ({k})" for n, k in schema.columns)
        raise ValueError(
            f"{what}: the columns {detail} hold {schema.size} values per event; "
            f"the model takes {input_size}"
        )
    if schema.classes is not None and outputs is not None:
        want = outputs if class_index else 2 if outputs == 1 else None
        if want is not None and len(schema.classes) != want:
            raise ValueError(
                f"{what}: {len(schema.classes)} class names "
                f"{list(schema.classes)}; the model's output has {want} classes"
            )
    return schema


__all__ = ["Schema", "check_column_name", "check_schema"]
