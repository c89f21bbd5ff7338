"""The layout of a CPU model as the constants of its ``Model`` struct (a mixin of the emitter in
codegen/cpu.py): the arena's areas, the parameters' tables, the loss and the I/O regions that
include/rootclad/model_runtime.h reads."""

from __future__ import annotations

import math

from rootclad.codegen.cpu_ops import cpu_op
from rootclad.codegen.cxx import comment_text, string_literal
from rootclad.ir.graph import CLASS_INDEX_LOSSES
from rootclad.ir.registry import OPS

# The ops before the first whole-chunk op (Linear, BatchNorm) run a few samples at a time: as
# many as keep about this many bytes of their activations and gradients in cache.
MICRO_BATCH_BYTES = 3 << 20
CTYPE = {"float32": "float", "float64": "double"}
# weighted_loss's number of each loss (ops/loss.h)
LOSS_KIND = {"bce_with_logits": 0, "mse": 1, "cross_entropy": 2, "nll": 3, "huber": 4}


class Layout:
    def layout_comment(self) -> list[str]:
        """The arena, region by region."""
        lines = [
            "// The arena. act: area F (the inputs, the output and what the head hands on: Bf",
            "// samples each), then H (the head's other values, one block per micro-batch), then",
            "// R (the rest's, one block per chunk); d_act the same with the adjoints' own plan.",
            "// Offsets are per sample within the area; in H and R the planner gives values that",
            "// are not alive at the same time the same memory (the ops' saves).",
            "//   pointer (act / d_act)           area  size    offset  d_offset  of",
        ]
        for r in self.regions:
            what = comment_text(r.label) + ("" if r.needs_adjoint else " (scratch)")
            lines.append(
                f"//   {r.act + ' / ' + r.adj:<32} {r.area}  {r.size:>7} {r.offset:>8} "
                f"{r.d_offset:>8}  {what}"
            )
        return lines

    def constants(self, prefix: str) -> list[str]:
        """The Model's layout constants and tables (model_runtime.h says what each is)."""
        size_of = self.area_size
        out, inp = self.output_region, self.input_region
        engine = f"{self.engine}{'' if self.pullbacks else '-nopullbacks'}"
        names = [string_literal(n) for n in self.param_offsets]
        offsets = [str(off) for off, _ in self.param_offsets.values()]
        dims, starts = [], []
        for _, shape in self.param_offsets.values():
            starts.append(str(len(dims)))
            dims += [str(d) for d in shape]
        starts.append(str(len(dims)))

        def table(ctype: str, name: str, values: list[str], end: str) -> str:
            return f"static constexpr {ctype} {name}[] = {{{', '.join([*values, end])}}};"

        micro = 1
        if self.planned and self.head_end:
            per_sample = self.head_size * 2 * (4 if self.g.dtype == "float32" else 8)
            micro = max(1, MICRO_BATCH_BYTES // max(per_sample, 1))
        ins, outs = self.g.input_shape, self.g.output_shape
        loss_col, loss_shape = self.g.loss_columns
        loss_size = math.prod(loss_shape)
        return [
            f"using T = {CTYPE[self.g.dtype]};",
            f"static constexpr long N_PARAMS = {self.n_params};",
            f"static constexpr long N_BUFFERS = {self.n_buffers}; // after the parameters",
            f"static constexpr bool BATCH_STATISTICS = {str(self.g.batch_statistics).lower()};",
            "// values a chunk shares per BatchNorm reduction (2 per channel and a count)",
            f"static constexpr long SYNC_SLOT = {self.sync_slot()};",
            "// the sweep leaves d_params alone when only the inputs' gradient is asked for",
            f"static constexpr bool PARAM_GRADIENT_SKIPPED = "
            f"{str(self.engine == 'pullback').lower()};",
            *self.layout_comment(),
            "// per-sample sizes of the areas",
            f"static constexpr long ACT_F = {size_of['act', 'F']};",
            f"static constexpr long ACT_H = {size_of['act', 'H']}, "
            f"DACT_H = {size_of['d_act', 'H']};",
            f"static constexpr long ACT_R = {size_of['act', 'R']}, "
            f"DACT_R = {size_of['d_act', 'R']};",
            "static constexpr long ACT_PER_SAMPLE = ACT_F + ACT_H + ACT_R;",
            "static constexpr long D_ACT_PER_SAMPLE = ACT_F + DACT_H + DACT_R;",
            f"static constexpr long ACT_FLAT_PER_SAMPLE = {self.flat_per_sample}; // no sharing",
            f"static constexpr double FLOPS_PER_SAMPLE = {self.flops}; // forward",
            f"static constexpr int MICRO = {micro}; // the head's micro-batch",
            "[[maybe_unused]] static constexpr T NOT_A_NUMBER = "
            "std::numeric_limits<T>::quiet_NaN();",
            f"static constexpr int LOSS_KIND = {LOSS_KIND[self.loss]}; // weighted_loss's",
            f"static constexpr long OUTPUT_OFFSET = {out.offset}, OUTPUT_SIZE = {out.size};",
            f"static constexpr long TARGET_SIZE = "
            f"{1 if self.loss in CLASS_INDEX_LOSSES else loss_size};",
            "// the output's columns the loss reads (a model with several outputs)",
            f"static constexpr long LOSS_COLUMN = {loss_col}, LOSS_SIZE = {loss_size};",
            f"static constexpr int N_INPUTS = {len(self.input_regions)};",
            f"static constexpr long INPUT_OFFSET = {inp.offset}, INPUT_SIZE = {inp.size};",
            f'static constexpr const char* ENGINE = "{engine}";',
            f'static constexpr const char* DTYPE = "{self.g.dtype}";',
            f'static constexpr const char* LOSS = "{self.loss}";',
            table("const char*", "PARAM_NAMES", names, "nullptr"),
            table("long", "PARAM_OFFSETS", offsets, "N_PARAMS"),
            table("long", "PARAM_DIMS", dims, "0"),
            table("int", "PARAM_DIM_STARTS", starts[:-1], starts[-1]),
            f"static constexpr int N_PARAM_TENSORS = {len(names)};",
            table("long", "INPUT_SHAPE", [str(d) for d in ins], "0"),
            f"static constexpr int INPUT_NDIM = {len(ins)};",
            table("long", "OUTPUT_SHAPE", [str(d) for d in outs], "0"),
            f"static constexpr int OUTPUT_NDIM = {len(outs)};",
            "",
        ]

    def sync_slot(self) -> int:
        """The most values one BatchNorm shares between chunks: 2 per channel and a count."""
        ops = [(n, cpu_op(n)) for n in self.g.nodes if not OPS[n.op].view]
        return max((op.sync_values(n) for n, op in ops if op.sync_values), default=0)
