"""Emit the C++ of one model: forward, loss, and a backward from the chosen engine.

Memory. Parameters live in one block (``params``, ``d_params``) in the order of the torch
module's ``named_parameters()``. Activations live in ``act`` (and their adjoints in ``d_act``),
laid out as one region per value of the graph, each ``B * per-sample size`` long: the model
inputs first, then each node's output (and its scratch, e.g. a Conv1d's im2col columns), in
the graph's order. Reshape, Flatten and Identity alias their input. Offsets are compile-time
per-sample constants multiplied by the run-time batch.

Every op's C++ comes from its entry in the op registry (:mod:`rootclad.ir.ops`): a list of
kernel calls, from which this module writes the forward call and, by Clad's convention, the
pullback call (the same arguments, then one adjoint per argument).

Engines.
- ``pullback``: this module writes the reverse sweep, calling each op's
  ``clad::custom_derivatives::rootclad::<op>_forward_pullback`` in reverse graph order. The
  pullbacks add into their inputs' adjoints, so a value read by several nodes receives the
  sum of their contributions.
- ``clad``: Clad writes the reverse pass. With the custom pullbacks the source asks
  ``clad::gradient`` of the forward's two parts (``replay_head`` per micro-batch,
  ``replay_rest``), run after the forward with the kernels replaying (kernels.h) so that
  Clad's sweep only calls the pullbacks; with ``pullbacks=False`` it asks
  ``clad::gradient(loss_fn, "params, act")`` and Clad differentiates the plain kernel loops.

The C API (``extern "C"``, every name prefixed ``rc_<hash>_``) is the same for both engines.
Besides the entry points it exports the layout (dtype, loss, input/output offsets and shapes,
parameter names/offsets/shapes), so C++ hosts such as ``rootclad/torch_function.h`` need
nothing but the library and its prefix.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rootclad.ir.graph import CLASS_INDEX_LOSSES, LOSSES, Graph, IRError, Node
from rootclad.ir.ops import OPS, Arg, Site

# the dummy a pullback takes for the adjoint of each kind of scalar argument
_SCALAR_ADJOINT = {"int": "&di", "real": "&dt", "u64": "&du", "long": "&dl"}
MIN_CHUNK = 4  # samples per thread below which a batch is not split (see parallel.h)
# The ops before the first Linear or BatchNorm run a few samples at a time (see _Emitter.source): as many
# as keep about this many bytes of their activations and gradients in cache.
MICRO_BATCH_BYTES = 3 << 20
_CTYPE = {"float32": "float", "float64": "double"}
_WORD = re.compile(r"\w+")  # a region pointer's name is one word (see _Emitter.region)


def _words(text: str) -> set[str]:
    """The words of C++ source: one pass over it finds every region pointer it names."""
    return set(_WORD.findall(text))


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

    name: str  # C++ name of its pointer: a_<name> into act, da_<name> into d_act
    size: int  # per-sample elements
    needs_adjoint: bool = True  # False: scratch (its adjoint is the pullback's workspace)
    area: str = "F"
    producer: int = -1  # index of the node that writes it (-1: a model input)
    last_read: int = -1  # index of the last node that reads it
    saved: bool = False  # a pullback reads it: kept until the backward is done
    offset: int = 0
    d_offset: int = 0

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


@dataclass
class EmittedModel:
    source: str
    prefix: str
    engine: str
    pullbacks: bool
    param_offsets: dict[str, tuple[int, tuple[int, ...]]]
    n_params: int
    act_per_sample: int  # act's length per sample (act_size(B) = B x this)
    input_region: Region  # the first input's (the only one's, for most models)
    output_region: Region
    output_shape: tuple[int, ...]
    regions: list[Region] = field(default_factory=list)
    buffer_offsets: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    n_buffers: int = 0
    input_regions: list[Region] = field(default_factory=list)  # one per model input, in order
    d_act_per_sample: int = 0  # d_act's (the adjoints' plan)
    flat_per_sample: int = 0  # one region per value, nothing shared: what the planner saves


class _Emitter:
    def __init__(self, graph: Graph, loss: str, engine: str, pullbacks: bool, check_plan=False):
        if loss not in LOSSES:
            raise IRError(f"loss {loss!r} is not supported; use one of {LOSSES}")
        self.g = graph
        self.loss = loss
        self.engine = engine
        self.pullbacks = pullbacks
        # the arena planner needs the micro-batched head and the adjoint markers of the
        # pullback engine and the clad engine's replay; Clad's own sweep (pullbacks=False)
        # keeps one region per value, all adjoints zeroed first
        self.planned = engine == "pullback" or pullbacks
        # ROOTCLAD_CHECK_PLAN: no sharing; what the plan calls dead is filled with NaN
        self.check_plan = check_plan and self.planned
        self.regions: list[Region] = []
        self.names: set[str] = set()  # the regions' names
        self.suffix: dict[str, int] = {}  # a name's next numbered variant to try
        self.adjoint_starts: dict[int, list[Region]] = {}  # by the node that reads it last
        self.param_offsets: dict[str, tuple[int, tuple[int, ...]]] = {}
        off = 0
        for p in graph.params:
            self.param_offsets[p.name] = (off, p.shape)
            off += p.numel
        self.n_params = off
        # buffers (BatchNorm's running statistics) follow the parameters in the same block:
        # params + N_PARAMS + offset; the optimizer never sees them
        self.buffer_offsets: dict[str, tuple[int, tuple[int, ...]]] = {}
        off = 0
        for p in graph.buffers:
            self.buffer_offsets[p.name] = (off, p.shape)
            off += p.numel
        self.n_buffers = off
        if graph.batch_statistics and not pullbacks:
            raise IRError(
                "BatchNorm needs pullbacks=True: its running statistics are updated in the "
                "forward pass, which Clad's own reverse sweep would restore"
            )
        self.flops = 0  # multiply-adds x 2 of one sample's forward (Linear and convolutions)
        self.fwd: list[str] = []
        self.bwd: list[str] = []  # reverse sweep, in forward order; reversed when emitted
        # train_step's reverse sweep at small batches: the same, but a Linear layer whose
        # parameters no other op uses updates them in place of storing their gradient
        self.bwd_update: list[str] = []
        self.fused_params: set[str] = set()
        self.uses = Counter(name for n in graph.nodes for name in n.params.values())

    def region(self, name: str, size: int, area: str, producer: int, **kw) -> Region:
        name = re.sub(r"_+", "_", re.sub(r"\W", "_", name)).strip("_") or "value"
        base, k = name, self.suffix.get(name, 1)
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        self.suffix[base] = k  # names are never freed: the next one tries from here
        r = Region(name, size, area=area if self.planned else "F", producer=producer, **kw)
        r.last_read = producer
        self.regions.append(r)
        return r

    @staticmethod
    def at(base: str, r: Region) -> str:
        """The chunk's (or micro-batch's) first sample of region r in act or d_act. An F
        region's pointer is its start in the whole batch of Bf samples, the chunk starts at
        b0; H and R pointers already point at the chunk's (micro-batch's) own part."""
        ptr = r.act if base == "act" else r.adj
        return f"{ptr} + (long)b0 * {r.size}" if r.area == "F" else ptr

    def param(self, node: Node, role: str, base: str = "params") -> str:
        name = node.params.get(role)
        if name is None:
            return "(T*)nullptr"
        return f"{base} + {self.param_offsets[name][0]}"

    def build(self) -> None:
        g = self.g
        nodes = g.nodes
        # the head: the ops before the first Linear or BatchNorm; it runs in micro-batches
        self.head_end = next(
            (i for i, n in enumerate(nodes) if n.op in ("linear", "batch_norm")), len(nodes)
        )
        # each value's region is its alias root's (reshape, flatten, identity alias input 0)
        root = {v: v for v in g.inputs}
        last_read: dict[str, int] = {}
        for idx, n in enumerate(nodes):
            for v in n.inputs:
                last_read[root[v]] = idx
            root[n.output] = root[n.inputs[0]] if OPS[n.op].calls is None else n.output
        self.last_read = last_read
        self.output_root = root[g.output]
        self.value_region: dict[str, Region] = {}
        for name, shape in zip(g.inputs, g.input_shapes, strict=True):
            r = self.region(name, math.prod(shape), "F", -1)
            self.value_region[name] = r
        self.input_regions = [self.value_region[name] for name in g.inputs]
        self.input_region = self.input_regions[0]
        self.head = None
        for idx, node in enumerate(nodes):
            if idx == self.head_end:
                self.head = self._head()
            self.node(idx, node)
            self.markers(idx)
        if self.head is None:
            self.head = self._head()
        self.output_region = self.value_region[g.output]
        self.output_region.saved = True
        self.flat_per_sample = sum(r.size for r in self.regions)
        self.layout()

    def _head(self) -> tuple[int, int, int]:
        """(forward lines, backward lines, per-sample size of the regions so far)."""
        return len(self.fwd), len(self.bwd), sum(r.size for r in self.regions)

    def area_of(self, idx: int, value: str) -> str:
        """F for the output and for a head value read after the head, else H or R."""
        if value == self.output_root:
            return "F"
        if idx < self.head_end:
            return "F" if self.last_read.get(value, idx) >= self.head_end else "H"
        return "R"

    def markers(self, idx: int) -> None:
        """After node idx: the adjoint of each H or R value it read last (or wrote, when
        nothing reads it) starts here in the reverse sweep: zeroed just before the pullbacks
        that add into it, so that adjoints of values alive at different times share memory.
        The forward's marker is a no-op that the clad engine's sweep turns into the zeroing
        (pullbacks.h: adjoint_start_forward_pullback)."""
        if not self.planned:
            return
        for r in self.adjoint_starts.get(idx, []):
            if r.area == "F":
                continue
            n = f"(long)B * {r.size}"
            self.fwd.append(f"::rootclad::adjoint_start_forward({r.act}, {n});")
            zero = f"::rootclad::zero({r.adj}, {n}); // {r.name}'s adjoint starts"
            self.bwd.append(zero)
            self.bwd_update.append(zero)

    def layout(self) -> None:
        """Offsets of every region: F in creation order, H and R by the planner. A region's
        activation lives from the node that writes it to its last reader, or to the end of the
        backward when a pullback reads it (the ops' ``saves``); its adjoint from the last
        reader (its marker) to the writer's pullback, a scratch's adjoint (the pullback's
        workspace) only during that pullback."""
        end = len(self.g.nodes)

        def act_span(r):
            return (r.producer, end if r.saved else r.last_read)

        def adjoint_span(r):
            return (r.producer, r.last_read)

        off = 0
        for r in self.regions:
            if r.area == "F":
                r.offset = r.d_offset = off
                off += r.size
        self.area_size = {("act", "F"): off, ("d_act", "F"): off}
        for area in ("H", "R"):
            rs = [r for r in self.regions if r.area == area]
            share = not self.check_plan
            self.area_size["act", area] = plan(rs, act_span, "offset", share)
            self.area_size["d_act", area] = plan(rs, adjoint_span, "d_offset", share)
        self.act_per_sample = sum(n for (base, _), n in self.area_size.items() if base == "act")
        self.d_act_per_sample = sum(n for (base, _), n in self.area_size.items() if base == "d_act")

    def pointer(self, base: str, r: Region) -> str:
        """The C++ initialiser of region r's pointer in a function with Bf, b0, B in scope."""
        off = r.offset if base == "act" else r.d_offset
        if r.area == "F":
            return f"{base} + (long)Bf * {off}"
        before = "ACT_F" if r.area == "H" else f"(ACT_F + {'D' if base == 'd_act' else ''}ACT_H)"
        area = ("D" if base == "d_act" else "") + f"ACT_{r.area}"
        return f"{base} + (long)Bf * {before} + (long)b0 * {area} + (long)B * {off}"

    def declare(self, body: str) -> list[str]:
        """Declarations of the region pointers ``body`` uses."""
        used = _words(body)
        lines = []
        for r in self.regions:
            for base, name in (("act", r.act), ("d_act", r.adj)):
                if name in used:
                    lines.append(f"  T* const {name} = {self.pointer(base, r)};")
        return lines

    def state(self, node: Node, role: str) -> tuple[str, str]:
        """A parameter's slices of the optimizer state: (m, v); see rootclad/optim.h."""
        name = node.params.get(role)
        if name is None:
            return "(T*)nullptr", "(T*)nullptr"
        off = self.param_offsets[name][0]
        return f"state + {off}", f"state + N_PARAMS + {off}"

    def render(self, arg: Arg, node: Node, out: Region, scratch: dict[str, Region]):
        """An argument's C++ expression, and the adjoint its pullback takes in its place."""
        if arg.kind in _SCALAR_ADJOINT:
            return arg.ref, _SCALAR_ADJOINT[arg.kind]
        if arg.kind == "param":
            d = self.param(node, arg.ref, "d_params")
            if self.engine == "pullback" and d != "(T*)nullptr":
                d = f"(need_dp ? {d} : (T*)nullptr)"  # see NO_PARAM_GRADIENT
            return self.param(node, arg.ref), d
        if arg.kind == "buffer":  # not trained: no adjoint
            name = node.buffers.get(arg.ref)
            at = (
                "(T*)nullptr"
                if name is None
                else f"params + N_PARAMS + {self.buffer_offsets[name][0]}"
            )
            return at, "(T*)nullptr"
        if arg.kind == "out":
            r = out
        elif arg.kind == "scratch":
            r = scratch[arg.ref]
        else:
            r = self.value_region[node.inputs[arg.ref]]
        d = self.at("d_act", r)
        if arg.kind == "in" and arg.nullable and any(r is x for x in self.input_regions):
            # a model input needs no gradient unless asked (saliency, autograd)
            d = f"(need_dx ? {d} : (T*)nullptr)"
        return self.at("act", r), d

    def node(self, idx: int, node: Node) -> None:
        spec = OPS[node.op]
        if spec.calls is None:  # reshape, flatten, identity: the output aliases the input
            self.value_region[node.output] = self.value_region[node.inputs[0]]
            return
        area = self.area_of(idx, node.output)
        # named after the node: conv1d_0, linear_fc1 (a Sequential's layers are numbered)
        label = node.name if node.name.startswith(node.op) else f"{node.op}_{node.name}"
        out = self.region(label, math.prod(node.out_shape), area, idx)
        out.last_read = self.last_read.get(node.output, idx)
        self.adjoint_starts.setdefault(out.last_read, []).append(out)
        self.value_region[node.output] = out
        sizes = spec.scratch(node, self.g) if spec.scratch else {}
        scratch_area = "H" if idx < self.head_end else "R"
        scratch = {
            k: self.region(f"{label}_{k}", n, scratch_area, idx, needs_adjoint=False)
            for k, n in sizes.items()
        }
        saves = ("in", "out", *sizes) if spec.saves is None else spec.saves
        for key in saves:
            if key == "in":
                for v in node.inputs:
                    self.value_region[v].saved = True
            elif key == "out":
                out.saved = True
            else:
                scratch[key].saved = True
        if spec.flops:
            self.flops += spec.flops(node, self.g)
        cd = "clad::custom_derivatives::rootclad::"
        shapes = ", ".join(map(str, node.in_shapes))
        self.fwd.append(f"// {node.name}: {node.op} {shapes} -> {node.out_shape}")
        lines = []
        for call in spec.calls(node, self.g, Site(idx)):
            rendered = [self.render(arg, node, out, scratch) for arg in call.args]
            primal = ", ".join(r[0] for r in rendered)
            adjoint = ", ".join(r[1] for r in rendered)
            self.fwd.append(f"::rootclad::{call.kernel}_forward({primal});")
            lines.append(f"{cd}{call.kernel}_forward_pullback({primal}, {adjoint});")
        self.bwd += lines
        if node.op == "linear" and all(self.uses[n] == 1 for n in node.params.values()):
            # train_step's sweep at small batches updates these parameters in place
            (OUT, _), (IN, D_IN), (W, _), (BIAS, DB), (R, _), (C, _), (OC, _) = rendered
            (WM, WV), (BM, BV) = self.state(node, "weight"), self.state(node, "bias")
            self.bwd_update.append(
                f"::rootclad::linear_backward_update({D_IN}, {self.at('d_act', out)}, {IN}, "
                f"{W}, {BIAS}, {R}, {C}, {OC}, {WM}, {WV}, {DB}, {BM}, {BV}, cfg, step);"
            )
            self.fused_params.update(node.params.values())
        else:
            self.bwd_update += lines

    # -- the loss -----------------------------------------------------------------------
    def loss_call(self) -> tuple[str, str]:
        """(forward expression, pullback statement) for the chunk's share of the batch loss.

        Each loss kernel returns the mean over its chunk; ``scale = B / Bf`` turns that into
        the chunk's share of the mean over the whole batch, and is the adjoint handed to the
        loss pullback.
        """
        out = self.output_region
        OUT, D_OUT = self.at("act", out), self.at("d_act", out)
        cd = "clad::custom_derivatives::rootclad::"
        if self.loss in CLASS_INDEX_LOSSES:
            shape = self.g.output_shape
            what = "logits" if self.loss == "cross_entropy" else "log-probabilities"
            if len(shape) != 1:
                raise IRError(f"{self.loss} needs {what} (B, classes); the model gives {shape}")
            NC = shape[0]
            Y = "y + (long)b0"
            return (
                f"::rootclad::{self.loss}_forward({OUT}, {Y}, B, {NC})",
                f"{cd}{self.loss}_forward_pullback({OUT}, {Y}, B, {NC}, scale, {D_OUT}, &di, &di);",
            )
        N = f"B * {out.size}"
        Y = f"y + (long)b0 * {out.size}"
        return (
            f"::rootclad::{self.loss}_forward({OUT}, {Y}, {N})",
            f"{cd}{self.loss}_forward_pullback({OUT}, {Y}, {N}, scale, {D_OUT}, &di);",
        )

    def function(self, signature: str, body: list[str], prologue=()):
        """A C++ function: its signature line (ending in "{"), ``prologue``, declarations of
        the region pointers the body uses, the body."""
        text = "\n".join(body)
        return [signature, *prologue, *self.declare(text), *body, "}", ""]

    def inline_pointers(self, lines: list[str]) -> list[str]:
        """Region pointers written out, for the functions Clad differentiates itself."""
        pointers = {}
        for r in self.regions:
            for base, name in (("act", r.act), ("d_act", r.adj)):
                pointers[name] = f"({self.pointer(base, r)})"
        return [_WORD.sub(lambda m: pointers.get(m[0], m[0]), ln) for ln in lines]

    def replay(self, name: str, body: list[str], chunk: str, grad_args: str, scope: str):
        """Clad's input for one part of the forward (its lines ``body``: the kernels replay,
        see kernels.h), taking each region it touches as a pointer, and the statements that
        run Clad's gradient of it with the adjoint pointers from d_act."""
        used = _words("\n".join(body))
        ptrs = [r for r in self.regions if r.act in used]
        params = "".join(f"T* {r.act}, " for r in ptrs)
        fn = [f"inline void {name}(T* params, {params}{chunk}) {{", *body, "}", ""]
        wrt = ", ".join(["params", *(r.act for r in ptrs)])
        primal = ", ".join(["params", *(r.act for r in ptrs)])
        adjoint = ", ".join(["d_params", *(r.adj for r in ptrs)])
        run = [
            scope,
            f'  auto grad = clad::gradient({name}, "{wrt}");',
            f"  grad.execute({primal}, {grad_args}, {adjoint});",
        ]
        return fn, run

    def layout_comment(self) -> list[str]:
        """The arena, region by region, at the top of the source."""
        lines = [
            "// The arena. act: area F (the inputs, the output and what the head hands on: Bf",
            "// samples each), then H (the head's other values, one block per micro-batch), then",
            "// R (the rest's, one block per chunk); d_act the same with the adjoints' own plan.",
            "// Offsets are per sample within the area; in H and R the planner gives values that",
            "// are not alive at the same time the same memory (ops.py: saves).",
            "//   pointer (act / d_act)                       area  size    offset  d_offset",
        ]
        for r in self.regions:
            what = "" if r.needs_adjoint else "  (scratch)"
            lines.append(
                f"//   {r.act + ' / ' + r.adj:<44} {r.area}  {r.size:>7} {r.offset:>8} "
                f"{r.d_offset:>8}{what}"
            )
        return lines

    def source(self, prefix: str, c_api: bool = True) -> str:
        ctype = _CTYPE[self.g.dtype]
        loss_expr, loss_pullback = self.loss_call()
        out = self.output_region
        inputs = self.input_regions
        ind = "  "
        written = self.regions[len(inputs) :]
        # the clad engine with custom pullbacks replays the forward for Clad's reverse sweep
        # (see kernels.h: replaying); its adjoints are the pullback engine's
        replay = self.engine == "clad" and self.pullbacks
        if self.planned:  # the output's and the head's results'; markers zero the others
            zeroed = [r for r in written if r.needs_adjoint and r.area == "F"]
        else:  # Clad accumulates into every adjoint it uses
            zeroed = [r for r in written if r.size]
        zero_dact = [
            f"{ind}::rootclad::zero({self.at('d_act', r)}, (long)B * {r.size});" for r in zeroed
        ]
        zero_dact += [
            f"{ind}if (need_dx) ::rootclad::zero({self.at('d_act', r)}, (long)B * {r.size});"
            for r in inputs
        ]
        poison_d = []
        if self.check_plan:  # every planned adjoint must be zeroed by its marker before use
            poison_d = [
                f"{ind}::rootclad::fill(d_act + (long)Bf * ACT_F + (long)b0 * DACT_H, "
                "(long)B * DACT_H, NOT_A_NUMBER);",
                f"{ind}::rootclad::fill(d_act + (long)Bf * (ACT_F + DACT_H) + (long)b0 * DACT_R, "
                "(long)B * DACT_R, NOT_A_NUMBER);",
            ]

        def poison_act(areas: str) -> list[str]:
            """ROOTCLAD_CHECK_PLAN: what no pullback reads (the plan lets other values reuse
            it in H and R), filled with NaN once the forward is past it."""
            if not self.check_plan:
                return []
            dead = [r for r in self.regions if r.area in areas and not r.saved and r.size]
            return [
                f"{ind}::rootclad::fill({self.at('act', r)}, (long)B * {r.size}, NOT_A_NUMBER);"
                for r in dead
            ]

        marker = "::rootclad::adjoint_start_forward("

        def indent(lines, markers=True):
            return [ind + ln for ln in lines if markers or not ln.startswith(marker)]

        nf, nb, size = self.head if self.planned else (0, 0, 0)
        fwd_head, fwd = self.fwd[:nf], self.fwd[nf:]
        bwd_head, bwd = list(reversed(self.bwd[:nb])), list(reversed(self.bwd[nb:]))
        loop = [
            "  for (int m0 = b0; m0 < b0 + B; m0 += MICRO) {",
            "    const int mB = b0 + B - m0 < MICRO ? b0 + B - m0 : MICRO;",
            "    {call};",
            "  }",
        ]

        def head_loop(call: str) -> list[str]:
            return [ln.replace("{call}", call) for ln in loop] if nf else []

        chunk = "int Bf, int b0, int B, int training, std::uint64_t seed"
        head = [
            f"// Generated by rootclad for model {prefix}: engine={self.engine}, "
            f"pullbacks={self.pullbacks}, dtype={self.g.dtype}, loss={self.loss}.",
            "// Do not edit: regenerate with rootclad.compile().",
            "//",
            "// Functions named *_chunk work on samples [b0, b0 + B) of a batch of Bf samples;",
            "// the C API at the end splits a batch into chunks over rootclad's thread pool.",
            "#include <atomic>",
            "#include <cstdint>",
            "#include <limits>",
            "#include <vector>",
        ]
        if self.engine == "clad":
            head.append('#include "clad/Differentiator/Differentiator.h"')
        head += ['#include "rootclad/kernels.h"']
        if self.has_train_chunk():
            head.append('#include "rootclad/linear_update.h"')
        if self.pullbacks:
            head.append('#include "rootclad/pullbacks.h"')
        else:  # the loss keeps its pullback: it reports the loss value (loss_pullbacks.h)
            head.append('#include "rootclad/loss_pullbacks.h"')
        size_of = self.area_size
        head += [
            '#include "rootclad/optim.h"',
            '#include "rootclad/parallel.h"',
            "",
            f"namespace {prefix} {{",
            f"using T = {ctype};",
            f"constexpr long N_PARAMS = {self.n_params};",
            f"constexpr long N_BUFFERS = {self.n_buffers}; // after the parameters, not trained",
            "// a gradient block: the parameters' and room for the buffers' (never written)",
            "constexpr long N_SLOTS = N_PARAMS + N_BUFFERS;",
            f"constexpr bool BATCH_STATISTICS = {str(self.g.batch_statistics).lower()};",
            "// need_dx flags: 1 = the inputs' gradient; 1 | NO_PARAM_GRADIENT = the inputs' alone:",
            "// the pullback engine then skips the parameters' (d_params is not filled)",
            "constexpr int NO_PARAM_GRADIENT = 2;",
            f"constexpr bool PARAM_GRADIENT_SKIPPED = {str(self.engine == 'pullback').lower()};",
            "// values a chunk shares per BatchNorm reduction (2 per channel and a count)",
            f"constexpr long SYNC_SLOT = {self.sync_slot()};",
            *self.layout_comment(),
            "// per-sample sizes of the areas",
            f"constexpr long ACT_F = {size_of['act', 'F']};",
            f"constexpr long ACT_H = {size_of['act', 'H']}, DACT_H = {size_of['d_act', 'H']};",
            f"constexpr long ACT_R = {size_of['act', 'R']}, DACT_R = {size_of['d_act', 'R']};",
            "constexpr long ACT_PER_SAMPLE = ACT_F + ACT_H + ACT_R;",
            "constexpr long D_ACT_PER_SAMPLE = ACT_F + DACT_H + DACT_R;",
            f"constexpr long ACT_FLAT_PER_SAMPLE = {self.flat_per_sample}; // one region per value",
            f"constexpr double FLOPS_PER_SAMPLE = {self.flops}; // forward, Linear and convolutions",
            "[[maybe_unused]] constexpr T NOT_A_NUMBER = std::numeric_limits<T>::quiet_NaN();",
            "",
        ]
        body = []
        if nf:
            per_sample = size * 2 * (4 if ctype == "float" else 8)  # act and d_act
            micro = max(1, MICRO_BATCH_BYTES // max(per_sample, 1))
            body += [
                "// The head: the ops before the first Linear or BatchNorm. forward_chunk() and backward_chunk()",
                "// run it MICRO samples at a time, so that one micro-batch's activations and",
                "// gradients are still in cache when the next op reads them.",
                f"constexpr int MICRO = {micro};",
                *self.function(
                    f"inline void forward_head(T* params, T* act, {chunk}) {{",
                    indent(fwd_head, markers=False) + poison_act("H"),
                ),
            ]
        body += [
            "// The forward pass; the input is already in act's first region.",
            *self.function(
                f"inline void forward_chunk(T* params, T* act, {chunk}) {{",
                head_loop("forward_head(params, act, Bf, m0, mB, training, seed)")
                + indent(fwd, markers=False)
                + poison_act("FR"),
            ),
            "// The chunk's share of the batch's mean loss, after forward_chunk().",
            *self.function(
                "inline T loss_chunk(T* act, const T* y, int Bf, int b0, int B) {",
                ["  const T scale = T(B) / T(Bf);", f"  return scale * {loss_expr};"],
            ),
        ]
        grad_call = (
            "backward_head(params, act, d_params, d_act, Bf, m0, mB, training, seed, need_dx)"
        )
        if self.planned:
            dummies = [
                "  int di = 0; T dt = 0; std::uint64_t du = 0; long dl = 0;",
                "  (void)di; (void)dt; (void)du; (void)dl;",
                "  const bool need_dp = !(need_dx & NO_PARAM_GRADIENT);",
                "  (void)need_dp;",
            ]
            sweep_head, sweep = indent(bwd_head), indent(bwd)
            if replay:  # the sweeps are Clad's gradients of the forward's two parts
                inputs_end = f"d_act + (long)Bf * {sum(r.size for r in inputs)}"
                scope = (
                    f"  ::rootclad::Replay scope(need_dx ? nullptr : d_act, "
                    f"need_dx ? nullptr : {inputs_end});"
                )
                grad_args = "Bf, b0, B, training, seed"
                body += [
                    "// What Clad differentiates: the forward, as the calls forward_chunk makes",
                    "// (the head's on a micro-batch). Replayed after forward_chunk, the kernels",
                    "// return at once and Clad's reverse sweep calls the pullbacks.",
                ]
                sweep_head = []
                if nf:
                    fn, sweep_head = self.replay(
                        "replay_head", indent(fwd_head), chunk, grad_args, scope
                    )
                    body += fn
                sweep = []
                if fwd:
                    fn, run = self.replay("replay_rest", indent(fwd), chunk, grad_args, scope)
                    body += fn
                    sweep = ["  {", *("  " + ln for ln in run), "  }"]
            if nf:
                body += [
                    "// The head's pullbacks on a micro-batch.",
                    *self.function(
                        f"inline void backward_head(T* params, T* act, T* d_params, T* d_act, "
                        f"{chunk},\n                          int need_dx) {{",
                        dummies + sweep_head,
                    ),
                ]
            body += [
                "// The reverse sweep: each op's pullback in reverse order. Expects the output's",
                "// adjoint filled and the other F adjoints zeroed (markers zero the rest).",
                *self.function(
                    f"inline void backward_chunk(T* params, T* act, T* d_params, T* d_act, "
                    f"{chunk},\n                           int need_dx) {{",
                    dummies + sweep + head_loop(grad_call),
                ),
                *self.function(
                    "inline T loss_and_grad_chunk(T* params, T* act, const T* y, T* d_params, "
                    f"T* d_act,\n                             {chunk}, int need_dx) {{",
                    [
                        "  int di = 0;",
                        "  const T scale = T(B) / T(Bf);",
                        *zero_dact,
                        *poison_d,
                        "  forward_chunk(params, act, Bf, b0, B, training, seed);",
                        "  T L = loss_chunk(act, y, Bf, b0, B);",
                        f"  {loss_pullback}",
                        "  backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, "
                        "need_dx);",
                        "  return L;",
                    ],
                ),
                "// Vector-Jacobian product for an upstream gradient d_out (Bf samples), after",
                "// forward_chunk().",
                *self.function(
                    "inline void vjp_chunk(T* params, T* act, T* d_params, T* d_act, const T* d_out,"
                    f"\n                    {chunk}, int need_dx) {{",
                    [
                        *zero_dact,
                        *poison_d,
                        f"  ::rootclad::copy({self.at('d_act', out)}, d_out + (long)b0 * {out.size}, "
                        f"(long)B * {out.size});",
                        "  backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, "
                        "need_dx);",
                    ],
                ),
                *self.train_chunk(nb, zero_dact + poison_d, loss_pullback, head_loop(grad_call)),
            ]
        else:
            OUT = self.at("act", out)
            fwd_text = "\n".join(indent(fwd))
            clad_own = [
                "// What Clad differentiates: the chunk's share of the loss, as a function of",
                "// params and act.",
                f"T loss_fn(T* params, T* act, const T* y, {chunk}) {{",
                fwd_text,
                f"  return T(B) / T(Bf) * {loss_expr};",
                "}",
                "",
                "// <model output, w>: its gradient is the vector-Jacobian product for w.",
                f"T out_dot(T* params, T* act, const T* w, {chunk}) {{",
                fwd_text,
                "  T s = 0;",
                f"  for (long i = 0; i < (long)B * {out.size}; ++i)",
                f"    s += ({OUT})[i] * w[i];",
                "  return s;",
                "}",
                "",
                "inline T loss_and_grad_chunk(T* params, T* act, const T* y, T* d_params, T* d_act,",
                f"                             {chunk}, int need_dx) {{",
                *zero_dact,
                '  auto grad = clad::gradient(loss_fn, "params, act");',
                "  grad.execute(params, act, y, Bf, b0, B, training, seed, d_params, d_act);",
                "  // the loss pullback noted the chunk's mean loss",
                "  return T(B) / T(Bf) * ::rootclad::last_loss<T>;",
                "}",
                "",
                "inline void vjp_chunk(T* params, T* act, T* d_params, T* d_act, const T* d_out,",
                f"                    {chunk}, int need_dx) {{",
                *zero_dact,
                '  auto grad = clad::gradient(out_dot, "params, act");',
                f"  const T* w = d_out + (long)b0 * {out.size};",
                "  grad.execute(params, act, w, Bf, b0, B, training, seed, d_params, d_act);",
                "}",
            ]
            body += self.inline_pointers(clad_own)
        body += [
            "",
            "// -- splitting a batch over threads ----------------------------------------------",
            "// Chunks of fewer samples than this are not worth a thread: BLAS threads instead.",
            f"constexpr int MIN_CHUNK = {MIN_CHUNK};",
            "enum Mode { FORWARD, LOSS_AND_GRAD, VJP };",
            "struct Job {",
            "  Mode mode;",
            "  T* params; T* act; const T* y; T* d_params; T* d_act; const T* d_out; T* scratch;",
            "  int Bf, training, need_dx;",
            "  std::uint64_t seed;",
            "  T loss[::rootclad::MAX_THREADS];",
            "  const T* w = nullptr; // per-sample loss weights (LOSS_AND_GRAD), or none",
            "  T* dz = nullptr;      // with w: the weighted loss's d_output, Bf samples",
            "  // BatchNorm in a batch split into chunks: the chunks' shared sums (parallel.h)",
            "  double* sync_values = nullptr;",
            "  std::atomic<int> arrived{0}, generation{0};",
            "};",
            "",
            "// The chunk's share of the weighted mean loss (kernels.h: weighted_loss) after",
            "// forward_chunk(); writes its gradient w.r.t. the output to dz (Bf samples).",
            *self.function(
                "inline T weighted_loss_chunk(T* act, const T* y, const T* w, T* dz, int Bf, "
                "int b0,\n                             int B) {",
                [
                    f"  return ::rootclad::weighted_loss({self.loss_kind()}, "
                    f"{self.at('act', out)}, {self.y_at()}, w + b0,",
                    f"                                   dz + (long)b0 * {out.size}, Bf, B, "
                    f"{out.size});",
                ],
            ),
            "inline void run_chunk(void* ctx, int t, int n) {",
            "  Job& j = *static_cast<Job*>(ctx);",
            "  ::rootclad::ChunkSync sync{t, n, j.sync_values, SYNC_SLOT, &j.arrived, &j.generation};",
            "  ::rootclad::ChunkSyncScope scope(BATCH_STATISTICS && n > 1 ? &sync : nullptr);",
            "  int b0, b1;",
            "  ::rootclad::chunk_range(j.Bf, n, t, b0, b1);",
            "  const int B = b1 - b0;",
            "  if (j.mode == FORWARD) {",
            "    forward_chunk(j.params, j.act, j.Bf, b0, B, j.training, j.seed);",
            "    return;",
            "  }",
            "  // thread 0 writes the caller's gradient, the others their own block of scratch",
            "  T* dp = t == 0 ? j.d_params : j.scratch + (long)(t - 1) * N_SLOTS;",
            *(
                ["  if (!(j.need_dx & NO_PARAM_GRADIENT))", "    ::rootclad::zero(dp, N_SLOTS);"]
                if self.engine == "pullback"
                else ["  ::rootclad::zero(dp, N_SLOTS); // Clad's sweep adds into it regardless"]
            ),
            "  if (j.mode == LOSS_AND_GRAD && j.w) {",
            "    // weighted: the loss's gradient is formed here, the model's backward is the VJP",
            "    // (the pullback engine's sweep, or Clad's gradient of <output, d_output>)",
            "    forward_chunk(j.params, j.act, j.Bf, b0, B, j.training, j.seed);",
            "    j.loss[t] = weighted_loss_chunk(j.act, j.y, j.w, j.dz, j.Bf, b0, B);",
            "    vjp_chunk(j.params, j.act, dp, j.d_act, j.dz, j.Bf, b0, B, j.training, j.seed,",
            "              j.need_dx);",
            "  } else if (j.mode == LOSS_AND_GRAD)",
            "    j.loss[t] = loss_and_grad_chunk(j.params, j.act, j.y, dp, j.d_act, j.Bf, b0, B,",
            "                                    j.training, j.seed, j.need_dx);",
            "  else",
            "    vjp_chunk(j.params, j.act, dp, j.d_act, j.d_out, j.Bf, b0, B, j.training, j.seed,",
            "              j.need_dx);",
            "}",
            "",
            "// Every extra chunk adds a parameter-gradient block to fill and sum, so a batch is",
            "// split when its activations outweigh the parameters, or its arithmetic does by far",
            "// (the MLP 2048-256-64-1: not at batch 64, at 256; the GW CNN: from batch 8).",
            "inline int threads_for(int Bf) {",
            "  if ((double)Bf * ACT_FLAT_PER_SAMPLE < 2.0 * N_PARAMS &&",
            "      (double)Bf * FLOPS_PER_SAMPLE < 256.0 * N_PARAMS)",
            "    return 1;",
            "  int n = ::rootclad::ThreadPool::instance().size();",
            "  int by_batch = Bf / MIN_CHUNK;",
            "  n = n < by_batch ? n : by_batch;",
            "  return n < 1 ? 1 : n;",
            "}",
            "",
            "// d_params += the other threads' gradients, split over the pool by parameter range.",
            "struct Reduce { T* d_params; const T* scratch; int parts; };",
            "inline void reduce_range(void* ctx, int t, int n) {",
            "  const Reduce& r = *static_cast<const Reduce*>(ctx);",
            "  int p0, p1;",
            "  ::rootclad::chunk_range((int)N_PARAMS, n, t, p0, p1);",
            "  for (int k = 0; k < r.parts; ++k) {",
            "    const T* src = r.scratch + (long)k * N_SLOTS;",
            "    for (int i = p0; i < p1; ++i)",
            "      r.d_params[i] += src[i];",
            "  }",
            "}",
            "",
            "inline T run(Job& j) {",
            "  auto& pool = ::rootclad::ThreadPool::instance();",
            "  const int n = threads_for(j.Bf);",
            "  // per calling thread, grown once: nothing is allocated in steady state",
            "  static thread_local std::vector<T> scratch, dz;",
            f"  if (j.w && dz.size() < (size_t)j.Bf * {out.size})",
            f"    dz.resize((size_t)j.Bf * {out.size});",
            "  j.dz = dz.data();",
            "  static thread_local std::vector<double> sync_values;",
            "  if (BATCH_STATISTICS && n > 1 && sync_values.size() < (size_t)n * SYNC_SLOT)",
            "    sync_values.resize((size_t)n * SYNC_SLOT);",
            "  j.sync_values = sync_values.data();",
            "  if (j.mode != FORWARD && n > 1) {",
            "    if (scratch.size() < (size_t)(n - 1) * N_SLOTS)",
            "      scratch.resize((size_t)(n - 1) * N_SLOTS);",
            "    j.scratch = scratch.data();",
            "  }",
            "  pool.run(run_chunk, &j, n);",
            "  if (j.mode == FORWARD)",
            "    return T(0);",
            "  if (n > 1 && !(j.need_dx & NO_PARAM_GRADIENT && PARAM_GRADIENT_SKIPPED)) {",
            "    Reduce r{j.d_params, j.scratch, n - 1};",
            "    pool.run(reduce_range, &r, N_PARAMS >= 65536 ? pool.size() : 1);",
            "  }",
            "  T L = 0;",
            "  for (int t = 0; t < n; ++t)",
            "    L += j.loss[t];",
            "  return L;",
            "}",
        ]
        P, PT = prefix, f"{prefix}_T"
        api = [
            *self.layout_tables(),
            f"}} // namespace {prefix}",
            "",
            "// The C API: loaded by ctypes (Python), Cling (ROOT) or linked by C++ programs. It is",
            "// all the library exports: the build hides everything else (-fvisibility=hidden),",
            "// so that two model libraries in one process never bind to each other's inline",
            "// functions and statics (their thread pools and per-thread flags then mixed, and a",
            "// training step deadlocked).",
            "#pragma GCC visibility push(default)",
            'extern "C" {',
            f"using {PT} = {P}::T;",
            f"long {P}_n_params() {{ return {P}::N_PARAMS; }}",
            f"long {P}_n_buffers() {{ return {P}::N_BUFFERS; }}",
            f"long {P}_act_size(int B) {{ return (long)B * {P}::ACT_PER_SAMPLE; }}",
            f"long {P}_d_act_size(int B) {{ return (long)B * {P}::D_ACT_PER_SAMPLE; }}",
            f'const char* {P}_engine() {{ return "{self.engine}'
            f'{"" if self.pullbacks else "-nopullbacks"}"; }}',
            f"void {P}_forward({PT}* params, {PT}* act, int B, int training, std::uint64_t seed) {{",
            f"  {P}::Job j{{{P}::FORWARD, params, act, nullptr, nullptr, nullptr, nullptr, nullptr,",
            "             B, training, 0, seed, {}};",
            f"  {P}::run(j);",
            "}",
            f"{PT} {P}_loss_value({PT}* act, const {PT}* y, int B) {{",
            f"  return {P}::loss_chunk(act, y, B, 0, B);",
            "}",
            "// w: per-sample loss weights (B values), or null",
            f"{PT} {P}_loss_and_grad({PT}* params, {PT}* act, const {PT}* y, {PT}* d_params, "
            f"{PT}* d_act, int B, int training, std::uint64_t seed, int need_dx, const {PT}* w) {{",
            f"  {P}::Job j{{{P}::LOSS_AND_GRAD, params, act, y, d_params, d_act, nullptr, nullptr,",
            "             B, training, need_dx, seed, {}};",
            "  j.w = w;",
            f"  return {P}::run(j);",
            "}",
            "// need_dx: 0, 1 (the inputs' gradient too), or 3 (the inputs' gradient alone: d_params",
            "// is then not filled)",
            f"void {P}_vjp({PT}* params, {PT}* act, {PT}* d_params, {PT}* d_act, const {PT}* d_out, "
            "int B, int training, std::uint64_t seed, int need_dx) {",
            f"  {P}::Job j{{{P}::VJP, params, act, nullptr, d_params, d_act, d_out, nullptr,",
            "             B, training, need_dx, seed, {}};",
            f"  {P}::run(j);",
            "}",
            "// forward + backward + optimizer update in one call; returns the loss.",
            "// tensor_steps: null (every parameter tensor at `step`), or each parameter tensor's",
            "// own step count, 0 for a frozen one (not updated). w: per-sample loss weights.",
            f"{PT} {P}_train_step({PT}* params, {PT}* act, const {PT}* y, {PT}* d_params, "
            f"{PT}* d_act, {PT}* opt_state, const double* opt_cfg, long step, int B, "
            f"std::uint64_t seed, const long* tensor_steps, const {PT}* w) {{",
            *(
                [
                    "  if (!tensor_steps && !w && B <= ::rootclad::FUSED_UPDATE_MAX_BATCH &&",
                    f"      {P}::threads_for(B) == 1)",
                    f"    return {P}::train_chunk(params, act, y, d_params, d_act, opt_state, "
                    "opt_cfg, step, B, seed);",
                ]
                if self.has_train_chunk()
                else []
            ),
            f"  {PT} L = {P}_loss_and_grad(params, act, y, d_params, d_act, B, 1, seed, 0, w);",
            "  if (!tensor_steps) {",
            f"    ::rootclad::optim_step(params, d_params, opt_state, {P}::N_PARAMS, opt_cfg, step);",
            "    return L;",
            "  }",
            f"  for (int i = 0; i < {P}::N_PARAM_TENSORS; ++i) {{",
            "    if (tensor_steps[i] <= 0)",
            "      continue;",
            f"    const long off = {P}::PARAM_OFFSETS[i], n = {P}::PARAM_OFFSETS[i + 1] - off;",
            "    ::rootclad::optim_step_mv(params + off, d_params + off, opt_state + off,",
            f"                              opt_state + {P}::N_PARAMS + off, n, opt_cfg,",
            "                              tensor_steps[i]);",
            "  }",
            "  return L;",
            "}",
            *self.layout_api(prefix),
            "}",
            "#pragma GCC visibility pop",
        ]
        if not c_api:  # a header (rootclad emit): the namespace alone, nothing exported
            api = [*self.layout_tables(), f"}} // namespace {prefix}"]
        return "\n".join(head + body + api) + "\n"

    def loss_kind(self) -> int:
        """The loss's number in rootclad::weighted_loss (kernels.h)."""
        return {"bce_with_logits": 0, "mse": 1, "cross_entropy": 2, "nll": 3, "huber": 4}[self.loss]

    def y_at(self) -> str:
        """The chunk's first target: one class index per sample, else one per output."""
        size = 1 if self.loss in CLASS_INDEX_LOSSES else self.output_region.size
        return f"y + (long)b0 * {size}"

    def sync_slot(self) -> int:
        """The most values one BatchNorm shares between chunks: 2 per channel and a count."""
        return max((2 * n.in_shape[0] + 1 for n in self.g.nodes if n.op == "batch_norm"), default=0)

    def has_train_chunk(self) -> bool:
        fused_ok = self.engine == "pullback" or self.pullbacks  # the clad engine's replay too
        return fused_ok and bool(self.fused_params)

    def train_chunk(
        self, nb: int, zero_dact: list[str], loss_pullback: str, head_loop: list[str]
    ) -> list[str]:
        """train_step at small batches, as one chunk: forward, loss, and a reverse sweep that
        updates each unshared Linear layer's parameters as soon as its gradient is known
        (rootclad/linear_update.h). The other parameters' gradients are formed as in
        loss_and_grad and updated at the end, one contiguous run of the block at a time."""
        if not self.has_train_chunk():
            return []
        runs: list[list[int]] = []  # [offset, size] of the parameters updated at the end
        for name, (off, shape) in self.param_offsets.items():
            if name in self.fused_params:
                continue
            if runs and runs[-1][0] + runs[-1][1] == off:
                runs[-1][1] += math.prod(shape)
            else:
                runs.append([off, math.prod(shape)])
        ind = "  "
        if self.engine == "pullback":
            sweep = [*(ind + ln for ln in reversed(self.bwd_update[nb:])), *head_loop]
            table = []
        else:  # Clad's sweep; its Linear pullbacks update the fused layers (pullbacks.h)
            weights = sorted(
                self.param_offsets[n.params["weight"]][0]
                for n in self.g.nodes
                if n.op == "linear" and n.params.get("weight") in self.fused_params
            )
            table = [
                f"const long FUSED_WEIGHTS[] = {{{', '.join(map(str, weights))}}};",
                "",
            ]
            sweep = [
                "  {",
                f"    ::rootclad::FusedUpdate<T> fused{{params, d_params, state, N_PARAMS, cfg, step, "
                f"FUSED_WEIGHTS, {len(weights)}}};",
                "    backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, need_dx);",
                "  }",
            ]
        return [
            "",
            *table,
            "// train_step at batches of at most FUSED_UPDATE_MAX_BATCH samples (linear_update.h):",
            "// the Linear layers' gradients are consumed by the optimizer as they are formed.",
            *self.function(
                "inline T train_chunk(T* params, T* act, const T* y, T* d_params, T* d_act, "
                "T* state,\n                     const double* cfg, long step, int B, "
                "std::uint64_t seed) {",
                self.train_chunk_body(runs, zero_dact, loss_pullback, sweep),
                prologue=[
                    "  const int Bf = B, b0 = 0, training = 1, need_dx = 0;",
                    "  const bool need_dp = true;",
                    "  int di = 0; T dt = 0; std::uint64_t du = 0; long dl = 0;",
                    "  (void)di; (void)dt; (void)du; (void)dl;",
                ],
            ),
        ]

    @staticmethod
    def train_chunk_body(runs, zero_dact, loss_pullback, sweep) -> list[str]:
        ind = "  "
        return [
            "  const T scale = T(1);",
            *zero_dact,
            *(f"{ind}::rootclad::zero(d_params + {off}, {n});" for off, n in runs),
            "  forward_chunk(params, act, Bf, b0, B, training, seed);",
            "  T L = loss_chunk(act, y, Bf, b0, B);",
            f"  {loss_pullback}",
            *sweep,
            *(
                f"{ind}::rootclad::optim_step_mv(params + {off}, d_params + {off}, state + {off}, "
                f"state + N_PARAMS + {off}, {n}, cfg, step);"
                for off, n in runs
            ),
            "  return L;",
        ]

    # -- layout metadata ----------------------------------------------------------------
    def layout_tables(self) -> list[str]:
        """Constant tables behind the layout functions; each ends in a sentinel, never empty."""
        names = [json.dumps(n) for n in self.param_offsets]
        offsets = [str(off) for off, _ in self.param_offsets.values()]
        dims, starts = [], []
        for _, shape in self.param_offsets.values():
            starts.append(str(len(dims)))
            dims += [str(d) for d in shape]
        starts.append(str(len(dims)))

        def table(ctype: str, name: str, values: list[str], end: str) -> str:
            return f"const {ctype} {name}[] = {{{', '.join([*values, end])}}};"

        return [
            "",
            "// Layout tables for the metadata functions of the C API.",
            table("char* const", "PARAM_NAMES", names, "nullptr"),
            table("long", "PARAM_OFFSETS", offsets, "N_PARAMS"),
            table("long", "PARAM_DIMS", dims, "0"),
            table("int", "PARAM_DIM_STARTS", starts[:-1], starts[-1]),
            table("long", "INPUT_SHAPE", [str(d) for d in self.g.input_shape], "0"),
            table("long", "OUTPUT_SHAPE", [str(d) for d in self.g.output_shape], "0"),
            f"constexpr int N_PARAM_TENSORS = {len(names)};",
            "",
        ]

    def layout_api(self, prefix: str) -> list[str]:
        """The model's layout, for C++ hosts (LibTorch, Cling) that run without the Python side.

        Offsets and sizes count elements of T per sample (multiply by B); shapes exclude the
        batch dimension. Out-of-range parameter indices give nullptr / -1.
        """
        P, ns = prefix, f"{prefix}::"
        inp, out = self.input_region, self.output_region
        ok = f"if (i < 0 || i >= {ns}N_PARAM_TENSORS)"
        return [
            "// Layout metadata: dtype, loss, per-sample input/output regions, parameters.",
            f'const char* {P}_dtype() {{ return "{self.g.dtype}"; }}',
            f'const char* {P}_loss() {{ return "{self.loss}"; }}',
            f"int {P}_n_inputs() {{ return {len(self.input_regions)}; }}",
            "// the first input's region and shape (C++ hosts take single-input models)",
            f"long {P}_input_offset() {{ return {inp.offset}; }}",
            f"long {P}_input_size() {{ return {inp.size}; }}",
            f"const long* {P}_input_shape(int* ndim) {{",
            f"  *ndim = {len(self.g.input_shape)};",
            f"  return {ns}INPUT_SHAPE;",
            "}",
            f"long {P}_output_offset() {{ return {out.offset}; }}",
            f"long {P}_output_size() {{ return {out.size}; }}",
            f"const long* {P}_output_shape(int* ndim) {{",
            f"  *ndim = {len(self.g.output_shape)};",
            f"  return {ns}OUTPUT_SHAPE;",
            "}",
            f"int {P}_param_count() {{ return {ns}N_PARAM_TENSORS; }}",
            f"const char* {P}_param_name(int i) {{",
            f"  {ok} return nullptr;",
            f"  return {ns}PARAM_NAMES[i];",
            "}",
            f"long {P}_param_offset(int i) {{",
            f"  {ok} return -1;",
            f"  return {ns}PARAM_OFFSETS[i];",
            "}",
            f"long {P}_param_numel(int i) {{",
            f"  {ok} return -1;",
            f"  return {ns}PARAM_OFFSETS[i + 1] - {ns}PARAM_OFFSETS[i];",
            "}",
            f"const long* {P}_param_shape(int i, int* ndim) {{",
            f"  {ok} {{",
            "    *ndim = -1;",
            "    return nullptr;",
            "  }",
            f"  *ndim = {ns}PARAM_DIM_STARTS[i + 1] - {ns}PARAM_DIM_STARTS[i];",
            f"  return {ns}PARAM_DIMS + {ns}PARAM_DIM_STARTS[i];",
            "}",
        ]


def emit_model(
    graph: Graph, loss: str, engine: str = "pullback", pullbacks: bool = True, c_api: bool = True
) -> EmittedModel:
    """Emit the C++ source for ``graph`` trained with ``loss``; see the module docstring.

    ``ROOTCLAD_CHECK_PLAN=1`` in the environment emits a checking build of the arena plan: no
    memory shared, but every activation the plan would let other values reuse is filled with
    NaN after the forward, and every planned adjoint before the backward, so a wrong ``saves``
    in the op registry or a missing adjoint marker turns gradients into NaN."""
    if engine not in ("pullback", "clad"):
        raise ValueError(f"engine must be 'pullback' or 'clad', got {engine!r}")
    if engine == "pullback" and not pullbacks:
        raise ValueError(
            "pullbacks=False needs engine='clad': without Clad, the pullbacks are "
            "the only derivatives rootclad has"
        )
    check = os.environ.get("ROOTCLAD_CHECK_PLAN", "") not in ("", "0")
    em = _Emitter(graph, loss, engine, pullbacks, check_plan=check)
    em.build()
    tag = f"{engine[0]}{'p' if pullbacks else 'n'}"
    prefix = f"rc_{graph.fingerprint()}_{loss[:3]}_{tag}"
    source = em.source(prefix, c_api)
    return EmittedModel(
        source=source,
        prefix=prefix,
        engine=engine,
        pullbacks=pullbacks,
        param_offsets=em.param_offsets,
        n_params=em.n_params,
        buffer_offsets=em.buffer_offsets,
        n_buffers=em.n_buffers,
        act_per_sample=em.act_per_sample,
        d_act_per_sample=em.d_act_per_sample,
        flat_per_sample=em.flat_per_sample,
        input_region=em.input_region,
        input_regions=em.input_regions,
        output_region=em.output_region,
        output_shape=graph.output_shape,
        regions=em.regions,
    )
