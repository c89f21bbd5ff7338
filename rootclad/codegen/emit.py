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
from collections import Counter
from dataclasses import dataclass, field

from rootclad.ir.graph import CLASS_INDEX_LOSSES, LOSSES, Graph, IRError, Node
from rootclad.ir.ops import OPS, Arg, Site

# the dummy a pullback takes for the adjoint of each kind of scalar argument
_SCALAR_ADJOINT = {"int": "&di", "real": "&dt", "u64": "&du", "long": "&dl"}
MIN_CHUNK = 4  # samples per thread below which a batch is not split (see parallel.h)
# The ops before the first Linear or BatchNorm run a few samples at a time (see _Emitter.source): as many
# as keep about this many bytes of their activations and gradients in cache.
MICRO_BATCH_BYTES = 3 << 20
_CTYPE = {"float32": "float", "float64": "double"}


@dataclass
class Region:
    name: str
    offset: int  # per-sample elements
    size: int  # per-sample elements
    needs_adjoint: bool = True


@dataclass
class EmittedModel:
    source: str
    prefix: str
    engine: str
    pullbacks: bool
    param_offsets: dict[str, tuple[int, tuple[int, ...]]]
    n_params: int
    act_per_sample: int
    input_region: Region  # the first input's (the only one's, for most models)
    output_region: Region
    output_shape: tuple[int, ...]
    regions: list[Region] = field(default_factory=list)
    buffer_offsets: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    n_buffers: int = 0
    input_regions: list[Region] = field(default_factory=list)  # one per model input, in order


class _Emitter:
    def __init__(self, graph: Graph, loss: str, engine: str, pullbacks: bool):
        if loss not in LOSSES:
            raise IRError(f"loss {loss!r} is not supported; use one of {LOSSES}")
        self.g = graph
        self.loss = loss
        self.engine = engine
        self.pullbacks = pullbacks
        self.regions: list[Region] = []
        self.offset = 0
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

    def region(self, name: str, size: int, needs_adjoint: bool = True) -> Region:
        r = Region(name, self.offset, size, needs_adjoint)
        self.regions.append(r)
        self.offset += size
        return r

    @staticmethod
    def at(base: str, r: Region) -> str:
        """The chunk's slice of region r: regions are Bf samples long, the chunk starts at b0."""
        return f"{base} + (long)Bf * {r.offset} + (long)b0 * {r.size}"

    def param(self, node: Node, role: str, base: str = "params") -> str:
        name = node.params.get(role)
        if name is None:
            return "(T*)nullptr"
        return f"{base} + {self.param_offsets[name][0]}"

    def build(self) -> None:
        g = self.g
        self.value_region: dict[str, Region] = {}
        for name, shape in zip(g.inputs, g.input_shapes, strict=True):
            self.value_region[name] = self.region(f"input:{name}", math.prod(shape))
        self.input_regions = [self.value_region[name] for name in g.inputs]
        self.input_region = self.input_regions[0]
        # the head: the ops before the first Linear or BatchNorm (lines of self.fwd / self.bwd), and the
        # regions they write but those read later (whose adjoints come from the rest); it
        # ends before the first BatchNorm too, which needs the whole chunk's statistics
        self.head = None
        for idx, node in enumerate(g.nodes):
            if node.op in ("linear", "batch_norm") and self.head is None:
                self.head = self._head(g.nodes[:idx], g.nodes[idx:])
            self.node(idx, node)
        if self.head is None:
            self.head = self._head(g.nodes, [])
        self.output_region = self.value_region[g.output]

    def _head(self, head: list[Node], rest: list[Node]) -> tuple[int, int, list[Region], int]:
        known = self.value_region  # the values written so far: the inputs and the head's
        reads = [v for n in rest for v in n.inputs] + [self.g.output]
        boundary = {id(known[v]) for v in reads if v in known}
        written = self.regions[len(self.input_regions) :]
        inner = [r for r in written if id(r) not in boundary]
        size = sum(r.size for r in self.regions)  # per sample, inputs included
        return len(self.fwd), len(self.bwd), inner, size

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
            return self.param(node, arg.ref), self.param(node, arg.ref, "d_params")
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
        out = self.region(f"{idx}:{node.name}", math.prod(node.out_shape))
        self.value_region[node.output] = out
        sizes = spec.scratch(node, self.g) if spec.scratch else {}
        scratch = {k: self.region(f"{idx}:{node.name}:{k}", n, False) for k, n in sizes.items()}
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

    def source(self, prefix: str) -> str:
        ctype = _CTYPE[self.g.dtype]
        loss_expr, loss_pullback = self.loss_call()
        out = self.output_region
        inputs = self.input_regions
        ind = "  "
        written = self.regions[len(inputs) :]
        # the clad engine with custom pullbacks replays the forward for Clad's reverse sweep
        # (see kernels.h: replaying); its adjoints are the pullback engine's
        replay = self.engine == "clad" and self.pullbacks
        if self.engine == "pullback" or replay:
            zeroed = [r for r in written if r.needs_adjoint]
        else:  # Clad accumulates into every adjoint it uses
            zeroed = [r for r in written if r.size]

        def zero(regions) -> str:
            return "\n".join(
                f"{ind}::rootclad::zero({self.at('d_act', r)}, (long)B * {r.size});"
                for r in regions
            )

        zero_dx = "\n".join(
            f"{ind}if (need_dx) ::rootclad::zero({self.at('d_act', r)}, (long)B * {r.size});"
            for r in inputs
        )
        fwd = "\n".join(ind + ln for ln in self.fwd)
        bwd = "\n".join(ind + ln for ln in reversed(self.bwd))
        # the head (the ops before the first Linear or BatchNorm) runs in micro-batches, in the
        # pullback engine and the clad engine's replay
        micro_ok = self.engine == "pullback" or replay
        nf, nb, head_regions, size = self.head if micro_ok else (0, 0, [], 0)
        zero_dact = zero(r for r in zeroed if r not in head_regions)
        if nf:
            per_sample = size * 2 * (4 if ctype == "float" else 8)  # act and d_act
            micro = max(1, MICRO_BATCH_BYTES // max(per_sample, 1))
            fwd_head = "\n".join(ind + ln for ln in self.fwd[:nf])
            fwd = "\n".join(ind + ln for ln in self.fwd[nf:])
            bwd_head = "\n".join(ind + ln for ln in reversed(self.bwd[:nb]))
            bwd = "\n".join(ind + ln for ln in reversed(self.bwd[nb:]))
            zero_head = zero(r for r in zeroed if r in head_regions)
            loop = (
                "  for (int m0 = b0; m0 < b0 + B; m0 += MICRO) {\n"
                "    const int mB = b0 + B - m0 < MICRO ? b0 + B - m0 : MICRO;\n"
                "    {call};\n"
                "  }"
            )
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
            "// values a chunk shares per BatchNorm reduction (2 per channel and a count)",
            f"constexpr long SYNC_SLOT = {self.sync_slot()};",
            f"constexpr long ACT_PER_SAMPLE = {self.offset};",
            f"constexpr double FLOPS_PER_SAMPLE = {self.flops}; // forward, Linear and convolutions",
            "",
        ]
        body = []
        if nf:
            body += [
                "// The head: the ops before the first Linear or BatchNorm. forward_chunk() and backward_chunk()",
                "// run it MICRO samples at a time, so that one micro-batch's activations and",
                "// gradients are still in cache when the next op reads them.",
                f"constexpr int MICRO = {micro};",
                f"inline void forward_head(T* params, T* act, {chunk}) {{",
                fwd_head,
                "}",
                "",
            ]
        body += [
            "// The forward pass; the input is already in act's first region.",
            f"inline void forward_chunk(T* params, T* act, {chunk}) {{",
            *(
                [loop.replace("{call}", "forward_head(params, act, Bf, m0, mB, training, seed)")]
                if nf
                else []
            ),  # fmt: skip
            fwd,
            "}",
            "",
            "// The chunk's share of the batch's mean loss, after forward_chunk().",
            "inline T loss_chunk(T* act, const T* y, int Bf, int b0, int B) {",
            "  const T scale = T(B) / T(Bf);",
            f"  return scale * {loss_expr};",
            "}",
            "",
        ]
        if self.engine == "pullback" or replay:
            dummies = [
                "  int di = 0; T dt = 0; std::uint64_t du = 0; long dl = 0;",
                "  (void)di; (void)dt; (void)du; (void)dl;",
            ]
            if replay:  # the sweeps are Clad's gradients of the forward's two parts
                inputs_end = f"d_act + (long)Bf * {sum(r.size for r in inputs)}"
                scope = (
                    f"  ::rootclad::Replay scope(need_dx ? nullptr : d_act, "
                    f"need_dx ? nullptr : {inputs_end});"
                )
                grad_args = "params, act, Bf, b0, B, training, seed, d_params, d_act"
                body += [
                    "// What Clad differentiates: the forward, as the calls forward_chunk makes",
                    "// (the head's on a micro-batch). Replayed after forward_chunk, the kernels",
                    "// return at once and Clad's reverse sweep calls the pullbacks.",
                    *(
                        [f"inline void replay_head(T* params, T* act, {chunk}) {{", fwd_head, "}"]
                        if nf
                        else []
                    ),
                    f"inline void replay_rest(T* params, T* act, {chunk}) {{",
                    fwd,
                    "}",
                    "",
                ]
                bwd_head = "\n".join(
                    [scope, '  auto grad = clad::gradient(replay_head, "params, act");',
                     f"  grad.execute({grad_args});"]
                )  # fmt: skip
                bwd = "\n".join(
                    [
                        "  {",
                        "  " + scope,
                        '    auto grad = clad::gradient(replay_rest, "params, act");',
                        f"    grad.execute({grad_args});",
                        "  }",
                    ]
                )
            if nf:
                body += [
                    "// The head's pullbacks on a micro-batch, after zeroing its adjoint regions.",
                    f"inline void backward_head(T* params, T* act, T* d_params, T* d_act, {chunk},",
                    "                          int need_dx) {",
                    *dummies,
                    zero_head,
                    bwd_head,
                    "}",
                    "",
                ]
            call = (
                "backward_head(params, act, d_params, d_act, Bf, m0, mB, training, seed, need_dx)"
            )
            body += [
                "// The reverse sweep: each op's pullback in reverse order. Expects the output",
                "// region of d_act filled and the other adjoint regions zeroed"
                + (" (but the head's)." if nf else "."),
                f"inline void backward_chunk(T* params, T* act, T* d_params, T* d_act, {chunk},",
                "                           int need_dx) {",
                *dummies,
                bwd,
                *([loop.replace("{call}", call)] if nf else []),
                "}",
                "",
                "inline T loss_and_grad_chunk(T* params, T* act, const T* y, T* d_params, T* d_act,",
                f"                             {chunk}, int need_dx) {{",
                "  int di = 0;",
                "  const T scale = T(B) / T(Bf);",
                zero_dact,
                zero_dx,
                "  forward_chunk(params, act, Bf, b0, B, training, seed);",
                "  T L = loss_chunk(act, y, Bf, b0, B);",
                f"  {loss_pullback}",
                "  backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, need_dx);",
                "  return L;",
                "}",
                "",
                "// Vector-Jacobian product for an upstream gradient d_out (Bf samples), after",
                "// forward_chunk().",
                "inline void vjp_chunk(T* params, T* act, T* d_params, T* d_act, const T* d_out,",
                f"                    {chunk}, int need_dx) {{",
                zero_dact,
                zero_dx,
                f"  ::rootclad::copy({self.at('d_act', out)}, d_out + (long)b0 * {out.size}, "
                f"(long)B * {out.size});",
                "  backward_chunk(params, act, d_params, d_act, Bf, b0, B, training, seed, need_dx);",
                "}",
                *self.train_chunk(
                    nb, zero_dact, loss_pullback, loop.replace("{call}", call) if nf else ""
                ),
            ]
        else:
            OUT = self.at("act", out)
            body += [
                "// What Clad differentiates: the chunk's share of the loss, as a function of",
                "// params and act.",
                f"T loss_fn(T* params, T* act, const T* y, {chunk}) {{",
                fwd,
                f"  return T(B) / T(Bf) * {loss_expr};",
                "}",
                "",
                "// <model output, w>: its gradient is the vector-Jacobian product for w.",
                f"T out_dot(T* params, T* act, const T* w, {chunk}) {{",
                fwd,
                "  T s = 0;",
                f"  for (long i = 0; i < (long)B * {out.size}; ++i)",
                f"    s += ({OUT})[i] * w[i];",
                "  return s;",
                "}",
                "",
                "inline T loss_and_grad_chunk(T* params, T* act, const T* y, T* d_params, T* d_act,",
                f"                             {chunk}, int need_dx) {{",
                zero_dact,
                zero_dx,
                '  auto grad = clad::gradient(loss_fn, "params, act");',
                "  grad.execute(params, act, y, Bf, b0, B, training, seed, d_params, d_act);",
                "  // the loss pullback noted the chunk's mean loss",
                "  return T(B) / T(Bf) * ::rootclad::last_loss<T>;",
                "}",
                "",
                "inline void vjp_chunk(T* params, T* act, T* d_params, T* d_act, const T* d_out,",
                f"                    {chunk}, int need_dx) {{",
                zero_dact,
                zero_dx,
                '  auto grad = clad::gradient(out_dot, "params, act");',
                f"  const T* w = d_out + (long)b0 * {out.size};",
                "  grad.execute(params, act, w, Bf, b0, B, training, seed, d_params, d_act);",
                "}",
            ]
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
            "inline T weighted_loss_chunk(T* act, const T* y, const T* w, T* dz, int Bf, int b0,",
            "                             int B) {",
            f"  return ::rootclad::weighted_loss({self.loss_kind()}, {self.at('act', out)}, "
            f"{self.y_at()}, w + b0,",
            f"                                   dz + (long)b0 * {out.size}, Bf, B, {out.size});",
            "}",
            "",
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
            "  ::rootclad::zero(dp, N_SLOTS);",
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
            "  if ((double)Bf * ACT_PER_SAMPLE < 2.0 * N_PARAMS &&",
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
            "  if (n > 1) {",
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

    def train_chunk(self, nb: int, zero_dact: str, loss_pullback: str, head_loop: str) -> list[str]:
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
            sweep = [*(ind + ln for ln in reversed(self.bwd_update[nb:])), *([head_loop] if head_loop else [])]  # fmt: skip
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
            "inline T train_chunk(T* params, T* act, const T* y, T* d_params, T* d_act, T* state,",
            "                     const double* cfg, long step, int B, std::uint64_t seed) {",
            "  const int Bf = B, b0 = 0, training = 1, need_dx = 0;",
            "  int di = 0; T dt = 0; std::uint64_t du = 0; long dl = 0;",
            "  (void)di; (void)dt; (void)du; (void)dl;",
            "  const T scale = T(1);",
            zero_dact,
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
            "}",
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
    graph: Graph, loss: str, engine: str = "pullback", pullbacks: bool = True
) -> EmittedModel:
    """Emit the C++ source for ``graph`` trained with ``loss``; see the module docstring."""
    if engine not in ("pullback", "clad"):
        raise ValueError(f"engine must be 'pullback' or 'clad', got {engine!r}")
    if engine == "pullback" and not pullbacks:
        raise ValueError(
            "pullbacks=False needs engine='clad': without Clad, the pullbacks are "
            "the only derivatives rootclad has"
        )
    em = _Emitter(graph, loss, engine, pullbacks)
    em.build()
    tag = f"{engine[0]}{'p' if pullbacks else 'n'}"
    prefix = f"rc_{graph.fingerprint()}_{loss[:3]}_{tag}"
    source = em.source(prefix)
    return EmittedModel(
        source=source,
        prefix=prefix,
        engine=engine,
        pullbacks=pullbacks,
        param_offsets=em.param_offsets,
        n_params=em.n_params,
        buffer_offsets=em.buffer_offsets,
        n_buffers=em.n_buffers,
        act_per_sample=em.offset,
        input_region=em.input_region,
        input_regions=em.input_regions,
        output_region=em.output_region,
        output_shape=graph.output_shape,
        regions=em.regions,
    )
