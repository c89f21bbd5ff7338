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
