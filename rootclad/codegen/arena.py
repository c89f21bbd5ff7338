"""The arena: one region of memory per value, and the planner that lets values whose
lifetimes do not overlap share memory. The CPU emitter (:mod:`rootclad.codegen.cpu`) plans
its activations and adjoints with it, the device programs (:mod:`rootclad.codegen.cuda`)
their adjoints."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Region:
    """One value's (or one node's scratch) memory in ``act``, and its adjoint's in ``d_act``.

    ``area``: ``F`` (fixed: the model inputs, the output and the values the head hands on to
    the rest, ``Bf x size`` each, never shared), ``H`` (the head's other values, laid out per
    micro-batch) or ``R`` (the rest's, laid out per chunk). In H and R the planner gives
    values whose lifetimes do not overlap the same memory (see :func:`plan`). ``offset`` and
    ``d_offset`` count elements per sample from the start of the region's area (F starts
    ``act``, so an F region's offset is where hosts find it).
    """

    name: str  # C++ name of its pointer: a_<name> into act, da_<name> into d_act (generated)
    size: int  # per-sample elements
    needs_adjoint: bool = True  # False: scratch (its adjoint is the pullback's workspace)
    area: str = "F"
    producer: int = -1  # index of the node that writes it (-1: a model input)
    last_read: int = -1  # index of the last node that reads it
    saved: bool = False  # a pullback reads it: kept until the backward is done
    offset: int = 0
    d_offset: int = 0
    label: str = ""  # what it holds, in the model's own words (for comments only)

    @property
    def act(self) -> str:
        return f"a_{self.name}"

    @property
    def adj(self) -> str:
        return f"da_{self.name}"


def plan(regions: list[Region], spans, key: str, share: bool = True) -> int:
    """First-fit placement: each region (largest first) goes to the lowest offset not used by
    a region whose span (first and last step, inclusive) overlaps its own; ``spans(r)`` gives
    the span, ``share=False`` gives every region its own memory. Sets attribute ``key``
    (``offset`` or ``d_offset``) and returns the area's per-sample size."""
    order = sorted(regions, key=lambda r: (-r.size, spans(r)))
    # the placed regions: memory [start, end), span [first, last]; numpy keeps the scan of
    # every placed region per region (the planner's one cost that grows with depth) short
    start, end, first, last = (np.zeros(len(order), np.int64) for _ in range(4))
    for i, r in enumerate(order):
        lo, hi = spans(r)
        busy = (first[:i] <= hi) & (lo <= last[:i]) if share else np.ones(i, bool)
        by_start = np.lexsort((end[:i][busy], start[:i][busy]))
        s, e = start[:i][busy][by_start], end[:i][busy][by_start]
        # the lowest free offset below each busy region, and above them all
        below = np.maximum.accumulate(np.concatenate(([0], e)))
        fits = np.flatnonzero(below[:-1] + r.size <= s)
        off = int(below[fits[0]] if fits.size else below[-1])
        setattr(r, key, off)
        start[i], end[i], first[i], last[i] = off, off + r.size, lo, hi
    return int(end.max(initial=0))
