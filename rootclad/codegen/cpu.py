"""Emit the C++ of one model for the CPU: its layout, forward, loss and backward.

The generated file holds only what differs per model: a namespace with one struct, ``Model``,
whose constants are the arena's layout and whose functions are the passes over one chunk of a
batch. What every model does the same way (splitting a batch over threads, summing gradients,
the weighted loss, the fused training step, the C API) is ``include/rootclad/model_runtime.h``,
which ``ROOTCLAD_EXPORT_MODEL`` at the end of the file instantiates for this model.

Memory. Parameters live in one block (``params``, ``d_params``) in the order of the torch
module's ``named_parameters()``, the buffers after them. Activations live in ``act`` (their
adjoints in ``d_act``), one region per value (and per op's scratch), laid out by the arena
planner (:mod:`rootclad.codegen.arena`): areas F (the inputs, the output and what the head
hands on, fixed), H (the head's other values, per micro-batch) and R (the rest's, per chunk).
Views (reshape, identity) alias their input. Offsets are per-sample constants
multiplied by the run-time batch.

Every op's calls come from :mod:`rootclad.codegen.cpu_ops`: a list of kernel calls, from which
this module writes the forward call and, by Clad's convention, the pullback call (the same
arguments, then one adjoint per argument).

Engines.
- ``pullback``: this module writes the reverse sweep, calling each op's
  ``clad::custom_derivatives::rootclad::<op>_forward_pullback`` in reverse graph order. The
  pullbacks add into their inputs' adjoints, so a value read by several nodes receives the sum
  of their contributions.
- ``clad``: Clad writes the reverse pass. The forward is cut into groups of at most
  ``CLAD_GROUP_NODES`` ops, and ``clad::gradient`` is asked of each group (a function of the
  regions it touches), the gradients run in reverse order: each request stays small, so Clad's
  time and memory grow with the model's depth, not faster. With the custom pullbacks the
  groups run after the forward with the kernels replaying (kernels.h), so that Clad's sweep
  only calls the pullbacks; with ``pullbacks=False`` Clad differentiates the plain kernel loops
  of each group itself.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field

from rootclad.codegen.arena import Region, plan
from rootclad.codegen.cpu_code import (
    CHUNK,
    Code,
    forward_lines,
    function,
    head_loop,
    indent,
    words,
)
from rootclad.codegen.cpu_layout import CTYPE, Layout
from rootclad.codegen.cpu_ops import Arg, Site, cpu_op
from rootclad.codegen.cpu_sweeps import CLAD_GROUP_NODES, Sweeps
from rootclad.codegen.cxx import comment_text
from rootclad.ir.graph import CLASS_INDEX_LOSSES, LOSSES, Graph, IRError, Node
from rootclad.ir.registry import OPS

# the dummy a pullback takes for the adjoint of each kind of scalar argument
_SCALAR_ADJOINT = {"int": "&di", "real": "&dt", "u64": "&du", "long": "&dl", "functor": "nullptr"}


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


class _Emitter(Sweeps, Layout):
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
        self.code: list[Code] = []
        self.fused_params: set[str] = set()  # the pullback engine's in-place updates
        self.uses = Counter(name for n in graph.nodes for name in n.params.values())

    # -- regions --------------------------------------------------------------------------
    def region(self, name: str, size: int, area: str, producer: int, label: str = "", **kw):
        """A new region; ``name``, made by the emitter from op names and positions (never from
        the model's own names, which may hold any text), is unique among the regions."""
        base, k = name, self.suffix.get(name, 1)
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        self.suffix[base] = k  # names are never freed: the next one tries from here
        area = area if self.planned else "F"
        r = Region(name, size, area=area, producer=producer, label=label, **kw)
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
        # the head: the ops before the first whole-chunk op; it runs in micro-batches
        self.head_end = next(
            (i for i, n in enumerate(nodes) if not OPS[n.op].view and cpu_op(n).whole_chunk),
            len(nodes),
        )
        # each value's region is its alias root's (views alias input 0)
        root = {v: v for v in g.inputs}
        last_read: dict[str, int] = {}
        for idx, n in enumerate(nodes):
            for v in n.inputs:
                last_read[root[v]] = idx
            root[n.output] = root[n.inputs[0]] if OPS[n.op].view else n.output
        self.last_read = last_read
        self.output_root = root[g.output]
        self.value_region: dict[str, Region] = {}
        for k, (name, shape) in enumerate(zip(g.inputs, g.input_shapes, strict=True)):
            self.value_region[name] = self.region(f"x{k}", math.prod(shape), "F", -1, name)
        self.input_regions = [self.value_region[name] for name in g.inputs]
        self.input_region = self.input_regions[0]
        head_size = None
        for idx, node in enumerate(nodes):
            if idx == self.head_end:
                head_size = sum(r.size for r in self.regions)
            code = Code(idx)
            self.code.append(code)
            self.node(idx, node, code)
            self.markers(idx, code)
        self.head_size = sum(r.size for r in self.regions) if head_size is None else head_size
        self.output_region = self.value_region[g.output]
        self.output_region.saved = True
        self.flat_per_sample = sum(r.size for r in self.regions)
        self.layout()

    def area_of(self, idx: int, value: str) -> str:
        """F for the output and for a head value read after the head, else H or R."""
        if value == self.output_root:
            return "F"
        if idx < self.head_end:
            return "F" if self.last_read.get(value, idx) >= self.head_end else "H"
        return "R"

    def markers(self, idx: int, code: Code) -> None:
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
            code.fwd.append(f"::rootclad::adjoint_start_forward({r.act}, {n});")
            zero = f"::rootclad::zero({r.adj}, {n}); // {r.name}'s adjoint starts"
            code.bwd.append(zero)
            code.bwd_update.append(zero)

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

    def pointer(self, base: str, r: Region, literal: bool = False) -> str:
        """The C++ initialiser of region r's pointer in a function with Bf, b0, B in scope;
        ``literal``: the areas' sizes as numbers (outside the Model struct)."""
        off = r.offset if base == "act" else r.d_offset
        if r.area == "F":
            return f"{base} + (long)Bf * {off}"
        d = "d_act" if base == "d_act" else "act"
        size = {k: str(self.area_size[k]) if literal else None for k in self.area_size}
        act_f = size["act", "F"] or "ACT_F"
        if r.area == "H":
            before = act_f
        else:
            h = size[d, "H"] or ("DACT_H" if base == "d_act" else "ACT_H")
            before = f"({act_f} + {h})"
        area = size[d, r.area] or (("D" if base == "d_act" else "") + f"ACT_{r.area}")
        return f"{base} + (long)Bf * {before} + (long)b0 * {area} + (long)B * {off}"

    def declare(self, body: str) -> list[str]:
        """Declarations of the region pointers ``body`` uses."""
        used = words(body)
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
        return f"state + {off}", f"state + {self.n_params + off}"

    def render(self, arg: Arg, node: Node, out: Region, scratch: dict[str, Region]):
        """An argument's C++ expression, and the adjoint its pullback takes in its place."""
        if arg.kind in _SCALAR_ADJOINT:
            return arg.ref, _SCALAR_ADJOINT[arg.kind]
        shift = f" + {arg.offset}" if arg.offset else ""
        if arg.kind == "param":
            d = self.param(node, arg.ref, "d_params")
            if d != "(T*)nullptr":
                d += shift
            if self.engine == "pullback" and d != "(T*)nullptr":
                d = f"(need_dp ? {d} : (T*)nullptr)"  # see NO_PARAM_GRADIENT
            return self.param(node, arg.ref) + shift, d
        if arg.kind == "buffer":  # not trained: no adjoint
            name = node.buffers.get(arg.ref)
            at = (
                "(T*)nullptr"
                if name is None
                else f"params + {self.n_params + self.buffer_offsets[name][0]}{shift}"
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

    def node(self, idx: int, node: Node, code: Code) -> None:
        spec = OPS[node.op]
        if spec.view:  # reshape, identity: the output aliases the input
            self.value_region[node.output] = self.value_region[node.inputs[0]]
            return
        lowering = cpu_op(node)
        code.computes = True
        area = self.area_of(idx, node.output)
        # named after the op and the node's place: linear_3 (node names are for comments)
        label = f"{node.op}_{idx}"
        out = self.region(label, math.prod(node.out_shape), area, idx, node.name)
        out.last_read = self.last_read.get(node.output, idx)
        self.adjoint_starts.setdefault(out.last_read, []).append(out)
        self.value_region[node.output] = out
        sizes = lowering.scratch(node, self.g) if lowering.scratch else {}
        scratch_area = "H" if idx < self.head_end else "R"
        scratch = {
            k: self.region(f"{label}_{k}", n, scratch_area, idx, node.name, needs_adjoint=False)
            for k, n in sizes.items()
        }
        for key in (*spec.saves, *lowering.scratch_saves):
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
        code.fwd.append(f"// {comment_text(node.name)}: {node.op} {shapes} -> {node.out_shape}")
        for call in lowering.calls(node, self.g, Site(idx)):
            rendered = [self.render(arg, node, out, scratch) for arg in call.args]
            primal = ", ".join(r[0] for r in rendered)
            adjoint = ", ".join(r[1] for r in rendered)
            code.fwd.append(f"::rootclad::{call.kernel}_forward({primal});")
            code.bwd.append(f"{cd}{call.kernel}_forward_pullback({primal}, {adjoint});")
        if lowering.fused_update and all(self.uses[n] == 1 for n in node.params.values()):
            # train_step's sweep at small batches updates these parameters in place
            states = {role: self.state(node, role) for role in spec.params}
            code.bwd_update.append(lowering.fused_update(rendered, self.at("d_act", out), states))
            self.fused_params.update(node.params.values())
        else:
            code.bwd_update += code.bwd

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
        col, shape = self.g.loss_columns
        if self.loss in CLASS_INDEX_LOSSES:
            what = "logits" if self.loss == "cross_entropy" else "log-probabilities"
            if len(shape) != 1:
                raise IRError(f"{self.loss} needs {what} (B, classes); the model gives "
                              f"{shape}{self.loss_output_name()}")  # fmt: skip
        if self.g.parts:  # one of several outputs: columns of the concatenated rows
            K = math.prod(shape)
            Y = "y + (long)b0" + ("" if self.loss in CLASS_INDEX_LOSSES else f" * {K}")
            args = f"LOSS_KIND, {OUT}, {Y}, (const T*)nullptr"
            tail = f"{col}, {K}, {out.size}"
            return (
                f"::rootclad::column_loss<T>({args}, (T*)nullptr, B, B, {tail})",
                f"::rootclad::column_loss<T>({args}, {D_OUT}, Bf, B, {tail});",
            )
        if self.loss in CLASS_INDEX_LOSSES:
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

    def loss_output_name(self) -> str:
        if not self.g.parts:
            return ""
        return f" (output {self.g.parts[self.g.loss_part][0]!r}, which the loss reads)"

    def function(self, signature: str, body: list[str], prologue=()) -> list[str]:
        """A static function of the Model struct: its signature line (ending in "{"),
        ``prologue``, declarations of the region pointers the body uses, the body; a long one
        in parts (cpu_code.function)."""
        return function(signature, body, prologue, self.declare)

    # -- the parts of the source --------------------------------------------------------
    def head_and_rest(self) -> tuple[list[Code], list[Code]]:
        """The nodes of the micro-batched head and of the rest (the head is empty when the
        arena is not planned: Clad's own sweep runs the forward on whole chunks)."""
        if not self.planned:
            return [], self.code
        return self.code[: self.head_end], self.code[self.head_end :]

    def zeroed(self) -> list[str]:
        """zero_adjoints' lines: the adjoints the sweep's markers do not zero."""
        written = self.regions[len(self.input_regions) :]
        if self.planned:  # the output's and the head's results'; markers zero the others
            zeroed = [r for r in written if r.needs_adjoint and r.area == "F"]
        else:  # Clad accumulates into every adjoint it uses
            zeroed = [r for r in written if r.size]
        lines = [f"  ::rootclad::zero({self.at('d_act', r)}, (long)B * {r.size});" for r in zeroed]
        lines += [
            f"  if (need_dx) ::rootclad::zero({self.at('d_act', r)}, (long)B * {r.size});"
            for r in self.input_regions
        ]
        if self.check_plan:  # every planned adjoint must be zeroed by its marker before use
            lines += [
                "  ::rootclad::fill(d_act + (long)Bf * ACT_F + (long)b0 * DACT_H, "
                "(long)B * DACT_H, NOT_A_NUMBER);",
                "  ::rootclad::fill(d_act + (long)Bf * (ACT_F + DACT_H) + (long)b0 * DACT_R, "
                "(long)B * DACT_R, NOT_A_NUMBER);",
            ]
        return lines

    def poison_act(self, areas: str) -> list[str]:
        """ROOTCLAD_CHECK_PLAN: what no pullback reads (the plan lets other values reuse it in
        H and R), filled with NaN once the forward is past it."""
        if not self.check_plan:
            return []
        dead = [r for r in self.regions if r.area in areas and not r.saved and r.size]
        return [
            f"  ::rootclad::fill({self.at('act', r)}, (long)B * {r.size}, NOT_A_NUMBER);"
            for r in dead
        ]

    def forward_functions(self, head: list[Code], rest: list[Code]) -> list[str]:
        out = []
        if head:
            out += [
                "// The head: the ops before the first Linear or BatchNorm, run MICRO samples at a",
                "// time, so that one micro-batch's activations and gradients are still in cache",
                "// when the next op reads them.",
                *self.function(
                    f"void forward_head(T* params, T* act, {CHUNK}) {{",
                    indent(forward_lines(head, markers=False)) + self.poison_act("H"),
                ),
            ]
        loop = head_loop("forward_head(params, act, Bf, m0, mB, training, seed)")
        out += [
            "// The forward pass; the inputs are already in act's first regions.",
            *self.function(
                f"void forward_chunk(T* params, T* act, {CHUNK}) {{",
                (loop if head else [])
                + indent(forward_lines(rest, markers=False))
                + self.poison_act("FR"),
            ),
        ]
        return out

    def source(self, prefix: str, c_api: bool = True) -> str:
        loss_expr, loss_pullback = self.loss_call()
        head, rest = self.head_and_rest()
        free, backward = self.backward_functions(head, rest)
        includes = ["#include <cstdint>", "#include <limits>"]
        if self.engine == "clad":
            includes.append('#include "clad/Differentiator/Differentiator.h"')
        # the kernels and their pullbacks (without them, ROOTCLAD_NO_PULLBACKS, the losses'
        # stay), and the runtime every model shares
        includes += ['#include "rootclad/kernels.h"', '#include "rootclad/model_runtime.h"']
        model = [
            *self.constants(prefix),
            *self.forward_functions(head, rest),
            "// The chunk's share of the batch's mean loss, after forward_chunk().",
            *self.function(
                "T loss_chunk(T* act, const T* y, int Bf, int b0, int B) {",
                ["  const T scale = T(B) / T(Bf);", f"  return scale * {loss_expr};"],
            ),
            "// The loss's adjoint (scale: the chunk's share of the mean) into the output's.",
            *self.function(
                "void loss_pullback(T* act, const T* y, T* d_act, int Bf, int b0, int B, T scale) {",
                ["  int di = 0;", f"  {loss_pullback}"],
            ),
            "// The adjoints the sweep does not zero itself.",
            *self.function(
                "void zero_adjoints(T* d_act, int Bf, int b0, int B, int need_dx) {",
                self.zeroed(),
            ),
            *backward,
            *self.train_functions(head, rest),
        ]
        lines = [
            f"// Generated by rootclad for model {prefix}: engine={self.engine}, "
            f"pullbacks={self.pullbacks}, dtype={self.g.dtype}, loss={self.loss}.",
            "// Do not edit: regenerate with rootclad.compile(). The runtime every model shares",
            "// (threads, the C API) is rootclad/model_runtime.h; this file holds what differs",
            "// per model. Functions named *_chunk work on samples [b0, b0 + B) of a batch of Bf.",
            *includes,
            "",
            f"namespace {prefix} {{",
            f"using T = {CTYPE[self.g.dtype]};",
            "",
        ]
        if free:
            lines += [
                "// What Clad differentiates: the forward in groups of at most "
                f"{CLAD_GROUP_NODES} ops, one",
                "// clad::gradient each"
                + (
                    " (replayed after forward_chunk: the kernels return at once and Clad's"
                    if self.pullbacks
                    else " (Clad differentiates the kernels' loops; the arena pointers are"
                ),
                "// reverse sweep calls the pullbacks)."
                if self.pullbacks
                else "// written out as numbers).",
                *free,
            ]
        lines += [
            "// The model as rootclad/model_runtime.h runs it.",
            "struct Model {",
            *indent(model),
            "};",
            f"}} // namespace {prefix}",
            "",
        ]
        if c_api:
            lines += [
                "// The C API (model_runtime.h): loaded by ctypes (Python), Cling (ROOT) or linked",
                "// by C++ programs.",
                f"ROOTCLAD_EXPORT_MODEL({prefix}, {prefix}::Model)",
                "",
            ]
        text = "\n".join(lines)
        return re.sub(r"[ \t]+\n", "\n", text)


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
