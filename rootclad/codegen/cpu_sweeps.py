"""The reverse sweeps of a CPU model (a mixin of the emitter in codegen/cpu.py): the pullback
engine's (each op's pullback, in reverse order), the clad engine's (Clad's gradient of groups of
at most CLAD_GROUP_NODES ops, run in reverse order), and train_step's fused sweep, which updates
parameters as soon as their gradient is formed."""

from __future__ import annotations

import math

from rootclad.codegen.cpu_code import (
    CHUNK,
    DUMMIES,
    WORD,
    Code,
    forward_lines,
    head_loop,
    indent,
    words,
)

# ops per clad::gradient request of the clad engine: a 100-op chain's one request took Clad
# 0.6 GB and a 200-op one 2.8 GB; in groups of 16, a 400-op chain compiles in 8 s and 0.3 GB
# (docs/internals.md, "Engines")
CLAD_GROUP_NODES = 16


class Sweeps:
    def groups(self, codes: list[Code]) -> list[list[Code]]:
        """The clad engine's requests: consecutive nodes, at most CLAD_GROUP_NODES that
        compute each (views and markers join the group of the node before them)."""
        out: list[list[Code]] = []
        count = CLAD_GROUP_NODES
        for c in codes:
            if c.computes and count == CLAD_GROUP_NODES:
                out.append([])
                count = 0
            if not out:
                out.append([])
            out[-1].append(c)
            count += c.computes
        return [g for g in out if forward_lines(g)]

    def group_name(self, part: str, k: int) -> str:
        return f"{'replay' if self.pullbacks else 'forward'}_{part}_{k}"

    def clad_group(self, name: str, group: list[Code]) -> tuple[list[str], list[str]]:
        """One of Clad's requests: a free function of the regions the group's forward touches
        (the arena pointers as numbers), and the statements that run its gradient, with the
        adjoints in d_act."""
        body = indent(forward_lines(group))
        if self.pullbacks:  # the replayed forward: the regions as arguments
            used = words("\n".join(body))
            ptrs = [r for r in self.regions if r.act in used]
            params = "".join(f"T* {r.act}, " for r in ptrs)
            fn = [f"inline void {name}(T* params, {params}{CHUNK}) {{", *body, "}", ""]
            wrt = ", ".join(["params", *(r.act for r in ptrs)])
            primal = ", ".join(["params", *(r.act for r in ptrs)])
            adjoint = ", ".join(["d_params", *(r.adj for r in ptrs)])
            inputs_end = f"d_act + (long)Bf * {sum(r.size for r in self.input_regions)}"
            run = [
                "  {",
                f"    ::rootclad::Replay scope(need_dx ? nullptr : d_act, "
                f"need_dx ? nullptr : {inputs_end});",
                f'    auto grad = clad::gradient({name}, "{wrt}");',
                f"    grad.execute({primal}, Bf, b0, B, training, seed, {adjoint});",
                "  }",
            ]
            return fn, run
        # Clad differentiates the kernels' loops: the function takes params and act whole
        pointers = {}
        for r in self.regions:
            pointers[r.act] = f"({self.pointer('act', r, literal=True)})"
        body = [WORD.sub(lambda m: pointers.get(m[0], m[0]), ln) for ln in body]
        fn = [f"inline void {name}(T* params, T* act, {CHUNK}) {{", *body, "}", ""]
        run = [
            "  {",
            f'    auto grad = clad::gradient({name}, "params, act");',
            "    grad.execute(params, act, Bf, b0, B, training, seed, d_params, d_act);",
            "  }",
        ]
        return fn, run

    def backward_functions(self, head: list[Code], rest: list[Code]) -> tuple[list, list]:
        """(free functions for Clad, Model functions): backward_head and backward_chunk, the
        reverse sweep; it expects the output's adjoint filled and the other F adjoints
        zeroed (markers zero the rest)."""
        grad_call = (
            "backward_head(params, act, d_params, d_act, Bf, m0, mB, training, seed, need_dx)"
        )
        prologue = [
            *DUMMIES,
            "  const bool need_dp = !(need_dx & ::rootclad::NO_PARAM_GRADIENT);",
            "  (void)need_dp;",
        ]
        free: list[str] = []
        sweeps = {}
        for part, codes in (("head", head), ("rest", rest)):
            if self.engine == "pullback":
                sweeps[part] = indent([ln for c in reversed(codes) for ln in reversed(c.bwd)])
                continue
            runs = []
            for k, group in enumerate(self.groups(codes)):
                fn, run = self.clad_group(self.group_name(part, k), group)
                free += fn
                runs.append(run)
            sweeps[part] = [ln for run in reversed(runs) for ln in run]
        signature = (
            f"void backward_{{}}(T* params, T* act, T* d_params, T* d_act, {CHUNK},\n"
            "                           int need_dx) {{"
        )
        out = []
        if head:
            out += [
                "// The head's pullbacks on a micro-batch.",
                *self.function(signature.format("head"), sweeps["head"], prologue),
            ]
        out += [
            "// The reverse sweep: each op's pullback in reverse order. Expects the output's",
            "// adjoint filled and the other F adjoints zeroed (markers zero the rest).",
            *self.function(
                signature.format("chunk"),
                sweeps["rest"] + (head_loop(grad_call) if head else []),
                prologue,
            ),
        ]
        return free, out

    # -- train_step's fused sweep -------------------------------------------------------
    def runs(self, names) -> list[tuple[int, int]]:
        """(offset, size) of the contiguous runs of the parameter block these tensors fill."""
        out: list[list[int]] = []
        for name, (off, shape) in self.param_offsets.items():
            if name not in names:
                continue
            if out and out[-1][0] + out[-1][1] == off:
                out[-1][1] += math.prod(shape)
            else:
                out.append([off, math.prod(shape)])
        return [tuple(r) for r in out]

    def update_sweep(self, head: list[Code], rest: list[Code]):
        """train_step at small batches: (the sweep, the parameters updated at the end by the
        runtime), or None when no parameter is updated in the sweep. The pullback engine
        calls Linear's fused backward and update (linear_update.h) for each unshared Linear;
        in the clad engine the Linear pullback that Clad's sweep calls does (a FusedUpdate
        lives during the sweep), and the other parameters of each group of the rest are
        updated as soon as the sweep has passed their first use."""
        head_sweep = head_loop(
            "backward_head(params, act, d_params, d_act, Bf, m0, mB, training, seed, need_dx)"
        )
        if self.engine == "pullback":
            if not self.fused_params:
                return None
            sweep = indent([ln for c in reversed(rest) for ln in reversed(c.bwd_update)])
            late = set(self.param_offsets) - self.fused_params
            return sweep + (head_sweep if head else []), late
        if not self.pullbacks:
            return None
        groups = self.groups(rest)
        used_in = {}  # parameter -> the groups of the rest that read it
        for k, group in enumerate(groups):
            for c in group:
                for name in self.g.nodes[c.index].params.values():
                    used_in.setdefault(name, set()).add(k)
        in_head = {name for c in head for name in self.g.nodes[c.index].params.values()}
        early = set(used_in) - in_head - self.fused_params
        weights = sorted(
            self.param_offsets[node.params["weight"]][0]
            for node in self.g.nodes
            if node.params.get("weight") in self.fused_params
        )
        if not early and not weights:
            return None
        sweep = []
        if weights:  # Linear's pullback (linear_update.h) updates these layers in place
            sweep = [
                f"  const long FUSED_WEIGHTS[] = {{{', '.join(map(str, weights))}}};",
                f"  ::rootclad::FusedUpdate<T> fused{{params, d_params, state, {self.n_params}, "
                f"cfg, step, FUSED_WEIGHTS, {len(weights)}}};",
            ]
        for k in reversed(range(len(groups))):
            _, run = self.clad_group(self.group_name("rest", k), groups[k])
            starts = [n for n in early if max(used_in[n]) == k]  # first added into here
            sweep += [f"  ::rootclad::zero(d_params + {off}, {n});" for off, n in self.runs(starts)]
            sweep += run
            done = [n for n in early if min(used_in[n]) == k]  # no use left in the sweep
            sweep += [
                f"  ::rootclad::optim_step_mv(params + {off}, d_params + {off}, state + {off}, "
                f"state + {self.n_params + off}, {n}, cfg, step);"
                for off, n in self.runs(done)
            ]
        return sweep + (head_sweep if head else []), (
            set(self.param_offsets) - early - self.fused_params
        )

    def train_functions(self, head, rest) -> list[str]:
        # a loss on one of several outputs runs as the weighted loss does: loss, then the VJP
        fused = None if self.g.parts else self.update_sweep(head, rest)
        if fused is None:
            return ["static constexpr bool FUSED_TRAIN_STEP = false;",
                    "static constexpr long UPDATE_RUNS[] = {-1};",
                    "static void backward_update_chunk(T*, T*, T*, T*, T*, const double*, long, "
                    "int, std::uint64_t) {}", ""]  # fmt: skip
        sweep, late = fused
        runs = ", ".join(f"{off}, {n}" for off, n in self.runs(late))
        return [
            "// train_step at batches of at most FUSED_UPDATE_MAX_BATCH samples: a sweep that",
            "// updates parameters as soon as their gradient is formed (model_runtime.h); the",
            "// runtime updates those of UPDATE_RUNS (offset, count) after it.",
            "static constexpr bool FUSED_TRAIN_STEP = true;",
            f"static constexpr long UPDATE_RUNS[] = {{{runs + ', ' if runs else ''}-1}};",
            *self.function(
                "void backward_update_chunk(T* params, T* act, T* d_params, T* d_act, T* state,\n"
                "                                  const double* cfg, long step, int B,\n"
                "                                  std::uint64_t seed) {",
                sweep,
                prologue=[
                    "  const int Bf = B, b0 = 0, training = 1, need_dx = 0;",
                    "  const bool need_dp = true;",
                    "  (void)training; (void)need_dx; (void)need_dp; (void)state; (void)cfg;",
                    "  (void)step; (void)seed;",
                    *DUMMIES,
                ],
            ),
        ]
