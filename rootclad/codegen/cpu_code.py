"""What the CPU emitter's parts share: one node's share of the passes, and C++ text helpers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

WORD = re.compile(r"\w+")  # a region pointer's name is one word (see the emitter's region())
# the arguments of the functions that work on one chunk of a batch
CHUNK = "int Bf, int b0, int B, int training, std::uint64_t seed"
# the dummies a pullback takes for the adjoints of scalar arguments
DUMMIES = [
    "  int di = 0; T dt = 0; std::uint64_t du = 0; long dl = 0;",
    "  (void)di; (void)dt; (void)du; (void)dl;",
]


def words(text: str) -> set[str]:
    """The words of C++ source: one pass over it finds every region pointer it names."""
    return set(WORD.findall(text))


def indent(lines, by: str = "  ") -> list[str]:
    return [by + ln if ln else ln for ln in lines]


@dataclass
class Code:
    """One node's share of the passes: its forward lines, its pullbacks (in forward order, to
    be reversed) and, for train_step's fused sweep, the same with in-place updates."""

    index: int
    fwd: list[str] = field(default_factory=list)
    bwd: list[str] = field(default_factory=list)
    bwd_update: list[str] = field(default_factory=list)
    computes: bool = False  # calls a kernel (not a view, not markers alone)


def head_loop(call: str) -> list[str]:
    """The loop that runs ``call`` on the micro-batches of the head."""
    return [
        "  for (int m0 = b0; m0 < b0 + B; m0 += MICRO) {",
        "    const int mB = b0 + B - m0 < MICRO ? b0 + B - m0 : MICRO;",
        f"    {call};",
        "  }",
    ]


def forward_lines(codes: list[Code], markers: bool = True) -> list[str]:
    marker = "::rootclad::adjoint_start_forward("
    return [ln for c in codes for ln in c.fwd if markers or not ln.startswith(marker)]


# the longest body of one function of a model's code (see function)
PART_LINES = 120


def function(signature: str, body: list[str], prologue, declare) -> list[str]:
    """A static function of the Model struct: its signature line (ending in "{"),
    ``prologue``, ``declare(text)``'s declarations of the region pointers the body uses, the
    body. A long void function is cut into parts of at most PART_LINES lines (each with the
    same arguments, prologue and the pointers it uses) that it calls in turn: the compiler's
    time then grows with the model's depth, not faster (400 and 1500 ops: 1.7 and 6.0 s)."""
    if len(body) <= PART_LINES or not signature.startswith("void "):
        return [f"static {signature}", *prologue, *declare("\n".join(body)), *body, "}", ""]
    statements, open_ = [], 0
    for ln in body:  # whole statements: a loop or a block, with the comments before it
        if open_ == 0 and (not statements or not statements[-1][-1].lstrip().startswith("//")):
            statements.append([])
        statements[-1].append(ln)
        open_ += ln.count("{") - ln.count("}")
    # declarations that open the body (train_step's FusedUpdate scope) stay in the caller
    outer = []
    while statements and statements[0][0].lstrip().startswith(("const ", "::rootclad::F")):
        outer += statements.pop(0)
    name = signature[5 : signature.index("(")]
    params = signature[signature.index("(") :].replace("\n", " ")
    args = ", ".join(re.findall(r"(\w+)\s*(?:,|\))", params))
    parts: list[list[str]] = [[]]
    for st in statements:
        if parts[-1] and len(parts[-1]) + len(st) > PART_LINES:
            parts.append([])
        parts[-1] += st
    out = []
    for k, part in enumerate(parts):
        head = signature.replace(f"{name}(", f"{name}_part{k}(", 1)
        out += [f"static {head}", *prologue, *declare("\n".join(part)), *part, "}", ""]
    calls = [f"  {name}_part{k}({args});" for k in range(len(parts))]
    return [*out, f"static {signature}", *outer, *calls, "}", ""]
