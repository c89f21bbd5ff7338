"""A compiled model's program for the device kernels (include/rootclad/device/, under the
umbrella device_kernels.h).

The same C++ source runs on the CPU (every kernel a loop over its indices, dev::Host) and on an
NVIDIA GPU (grid-stride kernels on a stream, dev::Cuda; ROOTCLAD_ON_CUDA). It holds the model's
launches alone: it declares the kernels (ROOTCLAD_DECLARATIONS_ONLY), which the device runtime
library holds, built once per executor (include/rootclad/device_runtime.cpp,
toolchain/recipes.py), so the host compiler builds it for either executor. Each op says how
it is called through its entry in codegen/cuda_ops.py (an elementwise op through its functor).
``act`` is flat, one region of B x size per value (and per op's per-sample scratch), values
that alias their input (reshape, identity) sharing it, then the shared scratch, then one
workspace that the ops use within a call (a chunk of a convolution's columns), as large as the
largest asks at that batch size (none where no op uses it). ``d_act`` holds the values' adjoints, planned
(:func:`plan_adjoints`) from D_ACT_PLAN_MIN_VALUES on (device_kernels.h: at any size on the
host, from 2^24 values on the GPU), one region each below. The C API takes a stream
(ignored on the CPU) and, where dropout draws its masks, a seed (as the CPU model's, one per
call):

    {name}_n_params(), _n_buffers()   parameters and buffers (BatchNorm's), in the graph's order
    {name}_act_size(B), _d_act_size(B)  act holds this many values (the values, then the ops'
                                      scratch and the workspace), d_act the values' adjoints
    {name}_d_act_store_size(B)        d_act for any batch up to B (d_act_size is not monotonic:
                                      a region each below the plan's threshold, planned above)
    {name}_workspace_size(B)          the workspace's share of act_size(B)
    {name}_forward(stream, params, buffers, act, B, training, seed)
    {name}_loss_and_grad(stream, params, buffers, act, y, w, loss, d_params, d_act, B,
                         training, seed)  y: the targets (class indices as T); w: per-sample
                                      loss weights, or null
    {name}_input_grad(stream, params, buffers, act, d_out, d_act, B, training, seed)
                                      the inputs' adjoints at the inputs' places in act (no
                                      parameter gradients)
    {name}_optim_step(stream, params, d_params, state, config, step, begin, count)
                                      the update of parameters [begin, begin + count) at `step`;
                                      config: rootclad::OptimConfig; state: 2 x n_params
                                      (SGD's momentum, or Adam's m then v)
    {name}_optim_step_in_memory(stream, params, d_params, state, config, step, constants, begin,
                                count)  the same with config and *step in device memory, *step
                                      advanced by one; constants: _optim_constants_size() bytes
                                      (a CUDA graph replays it: DeviceModel.cuda_graphs)

training: 1 (BatchNorm on the batch's statistics, updating the running ones; dropout on),
0 (eval mode), 2 (as 1, the running statistics left alone: a forward pass run again).
Each call returns 0, or (on the GPU) the CUDA error its launches met, which
{name}_error_text(code) names; on the host, {name}_launches() counts the kernel launches so far
that a GPU would make. The inputs go in at the start of act, one after the other
(B x per-sample size each); the output is at {name}_output_offset(B).
Ops come through the registry; losses: BCE with logits, MSE, Huber, cross-entropy and NLL (class
indices held as T), each the mean as in torch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from rootclad.codegen.arena import Region, plan
from rootclad.codegen.cuda_ops import (
    DeviceScratch,
    DeviceSite,
    device_op,
    fusable_activation,
    require_device_op,
)
from rootclad.codegen.cxx import comment_text
from rootclad.ir.graph import CLASS_INDEX_LOSSES, Graph, IRError
from rootclad.ir.registry import OPS

# elementwise losses: their functor in device_kernels.h; the class-index ones have kernels
LOSSES = {"bce_with_logits": "BceWithLogits", "mse": "Mse", "huber": "Huber",
          "cross_entropy": None, "nll": None}  # fmt: skip


def _workspace_lines(workspaces: list[str]) -> list[str]:
    """workspace_size(B), workspace_offset(B) and act_size(B): the workspace follows the values,
    the ops' per-sample and shared scratch, from a multiple of 32 values (128 bytes in float)."""
    if not workspaces:
        return [
            "inline long workspace_size(int) { return 0; }",
            "inline long act_size(int B) { return (long)B * ACT_PER_SAMPLE + SCRATCH; }",
        ]
    return [
        "// the workspace's values at batch B: the most any op uses within a call (0: no op",
        "// runs on one at this batch size)",
        "inline long workspace_size(int B) {",
        "  long n = 0;",
        *[f"  n = std::max(n, {w});" for w in workspaces],
        "  return n;",
        "}",
        "inline long workspace_offset(int B) {",
        "  return ((long)B * ACT_PER_SAMPLE + SCRATCH + 31) / 32 * 32;",
        "}",
        "inline long act_size(int B) { return workspace_offset(B) + workspace_size(B); }",
    ]


def _loss_lines(loss: str, graph: Graph) -> list[str]:
    """loss_and_grad's lines: the mean loss into *loss, its gradient into d_output; w: each
    sample's weight, or null (all 1). A model with several outputs: the columns of the one the
    loss reads (the others' adjoints stay zero)."""
    col, shape = graph.loss_columns
    tail = f", {graph.output_shape[0]}L, {col}L" if graph.parts else ""
    if loss in CLASS_INDEX_LOSSES:
        if len(shape) != 1:
            raise IRError(f"{loss} needs (B, classes) outputs; the model gives (B, {shape})")
        C = shape[0]
        grad_args = "output, y" if loss == "cross_entropy" else "y"
        return [f"  {loss}_forward(on, loss, output, y, w, B, {C}{tail});",
                f"  {loss}_backward(on, d_output, {grad_args}, w, B, {C}, T(1){tail});"]  # fmt: skip
    K = math.prod(shape)
    return [f"  loss_and_gradient(on, loss, d_output, output, y, w, {K}, (long)B * {K}, T(1), "
            f"{LOSSES[loss]}{{}}{tail});"]  # fmt: skip


def _c_api(name: str, T: str) -> list[str]:
    """The program's C API (the module docstring's), exported alone (ROOTCLAD_DEVICE_API: the
    recipes build the rest hidden); each call returns launch_status."""
    api = "ROOTCLAD_DEVICE_API"
    on = f"  const auto on = {name}::device(stream);"
    done = ["  return ::rootclad::dev::launch_status(on);", "}"]
    sizes = [
        (k, f"{name}::{k}(B)")
        for k in ("act_size", "workspace_size", "d_act_size", "d_act_store_size")
    ]
    sizes.append(("output_offset", f"(long){name}::OUTPUT_OFFSET * B"))
    return [
        f"{api} long {name}_n_params() {{ return {name}::N_PARAMS; }}",
        f"{api} long {name}_n_buffers() {{ return {name}::N_BUFFERS; }}",
        *[f"{api} long {name}_{k}(int B) {{ return {v}; }}" for k, v in sizes],
        f"{api} int {name}_forward(void* stream, const {T}* params, {T}* buffers, {T}* act,",
        "                         int B, int training, unsigned long long seed) {",
        on,
        f"  {name}::forward(on, params, buffers, act, B, training, seed);",
        *done,
        f"{api} int {name}_loss_and_grad(void* stream, const {T}* params, {T}* buffers,",
        f"    {T}* act, const {T}* y, const {T}* w, {T}* loss, {T}* d_params, {T}* d_act, int B,",
        "    int training, unsigned long long seed) {",
        on,
        f"  {name}::loss_and_grad(on, params, buffers, act, y, w, loss, d_params, d_act, B,",
        "                        training, seed);",
        *done,
        f"{api} int {name}_input_grad(void* stream, const {T}* params, {T}* buffers, {T}* act,",
        f"    const {T}* d_out, {T}* d_act, int B, int training, unsigned long long seed) {{",
        on,
        f"  {name}::input_grad(on, params, buffers, act, d_out, d_act, B, training, seed);",
        *done,
        f"{api} int {name}_optim_step(void* stream, {T}* params, const {T}* d_params,",
        f"    {T}* state, const double* config, long step, long begin, long count) {{",
        on,
        "  ::rootclad::dev::optim_step(on, params + begin, d_params + begin, state + begin,",
        f"      state + {name}::N_PARAMS + begin, count,",
        "      *reinterpret_cast<const ::rootclad::OptimConfig*>(config), step);",
        *done,
        f"{api} int {name}_optim_step_in_memory(void* stream, {T}* params, const {T}* d_params,",
        f"    {T}* state, const double* config, long* step, void* constants, long begin,",
        "    long count) {",
        on,
        "  ::rootclad::dev::optim_step_in_memory(on, params + begin, d_params + begin,",
        f"      state + begin, state + {name}::N_PARAMS + begin, count,",
        "      reinterpret_cast<const ::rootclad::OptimConfig*>(config), step,",
        f"      static_cast<::rootclad::OptimStep<{T}>*>(constants));",
        *done,
        f"{api} long {name}_optim_constants_size() {{",
        f"  return sizeof(::rootclad::OptimStep<{T}>);",
        "}",
        f"{api} const char* {name}_error_text(int code) {{",
        f"  return ::rootclad::dev::error_text({name}::device(nullptr), code);",
        "}",
        "#if !defined(__CUDACC__) && !defined(ROOTCLAD_ON_CUDA) // the launches a GPU would make",
        f"{api} long {name}_launches() {{",
        f"  return ::rootclad::dev::launch_count({name}::device(nullptr));",
        "}",
        "#endif",
    ]


@dataclass
class AdjointPlan:
    """d_act's layout (:func:`plan_adjoints`), in values per sample."""

    root: dict[str, str]  # each value -> the value whose memory it is (a view's: its input's)
    offset: dict[str, int]  # each root value's adjoint's place
    size: int  # d_act's
    fixed: int  # the inputs' and the output's adjoints come first; the planned ones after
    spans: dict[str, tuple[int, int]]  # each planned root: (producer, last reader) node indices
    zero_at: dict[int, list[str]]  # node index -> the adjoints zeroed just before its pullback


def plan_adjoints(graph: Graph, fused: dict, share: bool = True) -> AdjointPlan:
    """d_act's layout for the nodes that run (``fused``: :func:`fused_activations`, whose
    outputs their producers write): the adjoints of the model inputs (at their places in act)
    and of the output first, every other value's placed by the arena planner (emit.plan). An
    adjoint lives from the pullback of its last reader (the first to add into it) to its
    producer's (the last to read it), so adjoints alive at different times of the backward
    share memory. A planned adjoint whose memory an adjoint of a later value (one that dies
    earlier in the backward) used is zeroed where it starts; the others are zeroed with all of
    d_act before the backward. Without ``share`` each has its own region (none in ``zero_at``)."""
    root, size = {}, {}
    for x, shape in zip(graph.inputs, graph.input_shapes, strict=True):
        root[x], size[x] = x, math.prod(shape)
    fused_ids = {id(a) for a in fused.values()}
    producer, last_read = {}, {}
    for index, node in enumerate(graph.nodes):
        if OPS[node.op].view:  # a view of its input
            root[node.output] = root[node.inputs[0]]
            continue
        if id(node) in fused_ids:  # its producer writes its output
            continue
        written = fused[node.output].output if node.output in fused else node.output
        root[written], size[written], producer[written] = written, math.prod(node.out_shape), index
        for v in node.inputs:
            last_read[root[v]] = index
    offset, at = {}, 0
    for v in dict.fromkeys([*graph.inputs, root[graph.output]]):
        offset[v], at = at, at + size[v]
    regions = [
        Region(name=v, size=size[v], area="R", producer=producer[v],
               last_read=last_read.get(v, producer[v]))
        for v in producer if v not in offset
    ]  # fmt: skip
    total = plan(regions, lambda r: (r.producer, r.last_read), "d_offset", share)
    zero_at: dict[int, list[str]] = {}
    for r in regions:
        offset[r.name] = at + r.d_offset
        if share and any(
            q.producer > r.last_read
            and q.d_offset < r.d_offset + r.size
            and r.d_offset < q.d_offset + q.size
            for q in regions
        ):
            zero_at.setdefault(r.last_read, []).append(r.name)
    spans = {r.name: (r.producer, r.last_read) for r in regions}
    return AdjointPlan(root, offset, at + total, at, spans, zero_at)


def _zero_lines(spans: list[tuple[str, str]]) -> list[str]:
    """Lines that zero each (pointer, length) of ``spans``, up to three in one launch."""
    lines = []
    for i in range(0, len(spans), 3):
        group = spans[i : i + 3]
        if len(group) == 1:
            lines.append(f"  fill(on, {group[0][0]}, {group[0][1]}, T(0)); // its adjoint starts")
            continue
        group += [(group[0][0], "0")] * (3 - len(group))
        args = ", ".join(f"{p}, {n}" for p, n in group)
        lines.append(f"  zero(on, {args}); // their adjoints start")
    return lines


def fused_activations(graph: Graph) -> dict[str, object]:
    """The activations a device program fuses into their producer: producer's output value ->
    the activation node (cuda_ops.fusable_activation: its only reader, not the output)."""
    readers: dict[str, list] = {}
    for node in graph.nodes:
        for v in node.inputs:
            readers.setdefault(v, []).append(node)
    fused = {}
    for node in graph.nodes:
        after = readers.get(node.output, [])
        if (
            not OPS[node.op].view
            and (op := device_op(node)) is not None
            and op.fuses_activation
            and node.output != graph.output
            and len(after) == 1
            and fusable_activation(after[0])
            and after[0].inputs == [node.output]
        ):
            fused[node.output] = after[0]
    return fused


def emit_device(
    graph: Graph,
    name: str,
    loss: str = "bce_with_logits",
    fuse: bool = True,
    check_plan: bool | None = None,
) -> str:
    """C++ source of the device program of a validated ``graph`` (see the module docstring);
    ``fuse``: activations into their producers (:func:`fused_activations`).

    ``check_plan`` (default: ``ROOTCLAD_CHECK_PLAN=1`` in the environment, as for the CPU
    build) emits a checking build of d_act's plan: nothing shared, every planned adjoint NaN
    until its start, where it is zeroed, and NaN again after its producer's pullback, so that a
    kernel that reads an adjoint outside the span the plan gives it, or writes it before that
    span, spoils the gradients. Raises IRError naming the node whose op has no device kernel yet."""
    if check_plan is None:
        check_plan = os.environ.get("ROOTCLAD_CHECK_PLAN", "") not in ("", "0")
    if loss not in LOSSES:
        raise IRError(f"loss {loss!r} has no device kernel; device losses: {', '.join(LOSSES)}")
    T = {"float32": "float", "float64": "double"}[graph.dtype]
    # parameters and buffers: flat, each in the graph's order
    p_off, off = {}, 0
    for p in graph.params:
        p_off[p.name] = off
        off += p.numel
    n_params = off
    b_off, off = {}, 0
    for p in graph.buffers:
        b_off[p.name] = off
        off += p.numel
    n_buffers = off
    # values: one region each (per sample), the inputs first; aliases share their input's
    # region
    region, size, total = {}, {}, 0
    for x, shape in zip(graph.inputs, graph.input_shapes, strict=True):
        region[x], size[x] = total, math.prod(shape)
        total += size[x]
    inputs = set(graph.inputs)  # and, below, the views of an input: their adjoint is its
    fused = fused_activations(graph) if fuse else {}
    fused_ids = {id(a) for a in fused.values()}
    for node in graph.nodes:
        spec = OPS[node.op]
        if node.output in fused:  # never stored: the producer writes its activation's output
            continue
        if spec.view:  # a view of its input
            if node.inputs[0] in inputs:
                inputs.add(node.output)
            region[node.output] = region[node.inputs[0]]
            size[node.output] = size[node.inputs[0]]
            continue
        require_device_op(node)
        region[node.output], size[node.output] = total, math.prod(node.out_shape)
        total += size[node.output]
    out = graph.output
    flat, planned = plan_adjoints(graph, fused, share=False), plan_adjoints(graph, fused)
    if check_plan:  # nothing shared, every adjoint zeroed where it starts
        planned = replace(flat, zero_at={})
        for v, (_, last) in flat.spans.items():
            planned.zero_at.setdefault(last, []).append(v)
    root = flat.root
    # pointers are named by position (a_3, d_3); the model's own names go in comments only
    names = {v: f"v_{k}" for k, v in enumerate(region)}
    layout_extra = []  # the ops' per-sample scratch

    def ptr(v, d=False):
        return ("d" if d else "a") + names[v][1:]

    def d_span(v):
        return ptr(v, True), f"(long)B * {size[v]}"

    def site(node, index: int, dx: bool) -> DeviceSite:
        act = fused.get(node.output)
        written = act.output if act else node.output
        return DeviceSite(
            out=ptr(written),
            ins=tuple(ptr(v) for v in node.inputs),
            d_out=ptr(written, True),
            # the model inputs' adjoints: formed only for input_grad (dx)
            d_ins=tuple(
                "nullptr" if v in inputs and not dx else ptr(v, True) for v in node.inputs
            ),  # fmt: skip
            params={r: f"params + {p_off[p]}" for r, p in node.params.items()},
            # no parameter gradients for input_grad: the kernels skip a null one
            d_params={} if dx else {r: f"d_params + {p_off[p]}" for r, p in node.params.items()},
            buffers={r: f"buffers + {b_off[p]}" for r, p in node.buffers.items()},
            scratch=f"s_{index}",
            sample_scratch=f"t_{index}",
            workspace="work",
            index=index,
            act=fusable_activation(act) if act else "",
        )

    fwd, bwd, bwd_dx = [], [], []
    scratch, n_scratch = [], 0  # batch-independent scratch (BatchNorm's statistics)
    workspaces = []  # C++ expressions in B: the values an op uses within a call (a chunk's
    # convolution columns); one region for all, as large as the largest at that batch size
    for index, node in enumerate(graph.nodes):
        spec = OPS[node.op]
        if spec.view or id(node) in fused_ids:
            continue
        what = comment_text(node.describe())
        if node.output in fused:
            what += f" + {fused[node.output].op}, fused"
        hook = require_device_op(node).hook
        f, b, *used = hook(node, graph, site(node, index, False))
        _, b_dx, *_ = hook(node, graph, site(node, index, True))
        need = used[0] if used else DeviceScratch()
        if need.shared:
            scratch.append(f"  T* const s_{index} = scratch + {n_scratch};")
            n_scratch += need.shared
        if need.per_sample:  # a region of its own, after the values
            key = f"t_{index}"
            scratch.append(f"  T* const {key} = act + (long)B * {total};")
            layout_extra.append(f"//   {key:<24} per sample {need.per_sample:>8} at {total:>8}")
            total += need.per_sample
        if need.workspace and need.workspace not in workspaces:
            workspaces.append(need.workspace)
        # the adjoints that start here (its pullback is the first to add into them) and, in
        # the checking build, the one that ends here
        starts = [
            f"  if (planned) {line.lstrip()}"
            for line in _zero_lines([d_span(v) for v in planned.zero_at.get(index, [])])
        ]
        written = fused[node.output].output if node.output in fused else node.output
        ends = []
        if check_plan and written in flat.spans:
            ends = ["  fill(on, {}, {}, nan); // its adjoint ends".format(*d_span(written))]
        fwd += [f"  // {what}"] + [f"  {line}" for line in f]
        bwd = [f"  // {what}", *starts, *[f"  {line}" for line in b], *ends, *bwd]
        bwd_dx = [f"  // {what}", *starts, *[f"  {line}" for line in b_dx], *ends, *bwd_dx]
    if workspaces:  # the last region, aligned
        scratch.append("  T* const work = act + workspace_offset(B);")
        layout_extra.append("//   workspace: after the shared scratch, workspace_size(B) values")

    def d_offset(v) -> str:
        """v's adjoint's place per sample in d_act, as laid out at batch B."""
        v = root[v]
        d_plan, d_flat = planned.offset, flat.offset
        return (
            str(d_plan[v]) if d_plan[v] == d_flat[v] else f"(planned ? {d_plan[v]} : {d_flat[v]})"
        )

    def pointers(kind: str, const: bool) -> list[str]:
        q = "const " if const else ""
        if kind == "d":
            return [
                "  const bool planned = d_act_planned(B);",
                "  (void)planned;",
                *[
                    f"  {q}T* const d{names[v][1:]} = d_act + (long)B * {d_offset(v)};"
                    for v in region
                ],
                *([f"  const T nan = {nan};"] if check_plan else []),
            ]
        lines = [f"  {q}T* const a{names[v][1:]} = act + (long)B * {region[v]};" for v in region]
        if kind == "a":
            lines += [
                "  T* const scratch = act + (long)B * ACT_PER_SAMPLE;",
                "  (void)scratch;",
                *scratch,
            ]
        return lines

    layout = [
        f"//   {names[v][2:]:<8} per sample {size[v]:>8} at {region[v]:>8}, adjoint at "
        f"{planned.offset[root[v]]:>8} / {flat.offset[root[v]]:>8}  {comment_text(v)}"
        for v in region
    ]
    out_size = size[out]
    # the checking build: d_act's planned area NaN until each adjoint starts
    nan = "std::numeric_limits<T>::quiet_NaN()"
    planned_area = "d_act + (long)B * D_ACT_FIXED, d_act_size(B) - (long)B * D_ACT_FIXED"
    poison = [f"  fill(on, {planned_area}, {nan});"] if check_plan else []
    lines = [
        f"// Device program of a rootclad model ({graph.dtype}); generated by",
        "// rootclad/codegen/cuda.py{}.".format(
            " (the checking build of d_act's plan)" if check_plan else ""
        ),
        "// Values in act; their adjoints in d_act, planned / a region each:",
        *layout,
        *layout_extra,
        "#include <rootclad/device_kernels.h>",
        *(["#include <limits>"] if check_plan else []),
        "",
        f"namespace {name} {{",
        "using namespace ::rootclad::dev;",
        f"using T = {T};",
        "using U64 = unsigned long long; // dropout's seed",
        f"constexpr long N_PARAMS = {n_params};",
        f"constexpr long N_BUFFERS = {n_buffers};",
        f"constexpr long ACT_PER_SAMPLE = {total}, SCRATCH = {n_scratch};",
        f"constexpr long OUTPUT_OFFSET = {region[out]}, OUTPUT_SIZE = {out_size};",
        "// d_act per sample: the values' adjoints planned, or a region each; the inputs' and",
        "// the output's come first in both",
        f"constexpr long D_ACT_PLANNED = {planned.size}, D_ACT_FLAT = {flat.size},",
        f"               D_ACT_FIXED = {flat.fixed};",
        f"constexpr long D_OUTPUT_OFFSET = {flat.offset[root[out]]};",
        "inline bool d_act_planned(int B) {",
        "  return true; // the checking build of the plan"
        if check_plan
        else "  return (long)B * D_ACT_FLAT >= D_ACT_PLAN_MIN_VALUES; // device_kernels.h",
        "}",
        "inline long d_act_size(int B) {",
        "  return (long)B * (d_act_planned(B) ? D_ACT_PLANNED : D_ACT_FLAT);",
        "}",
        "// d_act for every batch up to B: a smaller one with a region each may need more",
        "inline long d_act_store_size(int B) {",
        "  if (!d_act_planned(B))",
        "    return d_act_size(B);",
        "  long flat = std::min((long)B - 1, (D_ACT_PLAN_MIN_VALUES - 1) / D_ACT_FLAT);",
        "  if (flat < 1 || d_act_planned((int)flat)) // none below B",
        "    return d_act_size(B);",
        "  return std::max(d_act_size(B), flat * D_ACT_FLAT);",
        "}",
        "",
        *_workspace_lines(workspaces),
        "",
        "template <class On>",
        "void forward(On on, const T* params, T* buffers, T* act, int B, int training, U64 seed) {",
        *pointers("a", False),
        *fwd,
        "}",
        "",
        "// d_params and d_act += the pullback of forward() for the output adjoint in d_act; the",
        "// inputs' adjoints are formed by backward_input only",
        *[
            line
            for fn, body in (("backward", bwd), ("backward_input", bwd_dx))
            for line in (
                "template <class On>",
                f"void {fn}(On on, const T* params, T* act, T* d_params, T* d_act, int B,",
                "          int training, U64 seed) {",
                *pointers("a", False),
                *pointers("d", False),
                *body,
                "}",
            )
        ],
        "",
        "template <class On>",
        "void loss_and_grad(On on, const T* params, T* buffers, T* act, const T* y, const T* w,",
        "                   T* loss, T* d_params, T* d_act, int B, int training, U64 seed) {",
        "  forward(on, params, buffers, act, B, training, seed);",
        "  zero(on, loss, 1, d_params, N_PARAMS, d_act, d_act_size(B));",
        *poison,
        "  const T* const output = act + (long)B * OUTPUT_OFFSET;",
        "  T* const d_output = d_act + (long)B * D_OUTPUT_OFFSET;",
        *_loss_lines(loss, graph),
        "  backward(on, params, act, d_params, d_act, B, training, seed);",
        "}",
        "",
        "// the inputs' places in d_act = d(sum of output x d_out) / d input",
        "template <class On>",
        "void input_grad(On on, const T* params, T* buffers, T* act, const T* d_out, T* d_act,",
        "                int B, int training, U64 seed) {",
        "  forward(on, params, buffers, act, B, training, seed);",
        "  fill(on, d_act, d_act_size(B), T(0));",
        *poison,
        "  T* const d_output = d_act + (long)B * D_OUTPUT_OFFSET;",
        "  copy(on, d_output, d_out, (long)B * OUTPUT_SIZE);",
        "  backward_input(on, params, act, nullptr, d_act, B, training, seed);",
        "}",
        "",
        "// the executor: ROOTCLAD_ON_CUDA (the recipe's) or nvcc, the GPU; otherwise host loops",
        "#if defined(__CUDACC__) || defined(ROOTCLAD_ON_CUDA)",
        "inline Cuda device(void* stream) { return Cuda{(cudaStream_t)stream}; }",
        "#else",
        "inline Host device(void*) { return Host{}; }",
        "#endif",
        f"}} // namespace {name}",
        "",
        *_c_api(name, T),
        "",
    ]
    return "\n".join(lines)
