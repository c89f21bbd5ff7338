"""The constants of an exported program: which nodes the inputs' values reach, and the values
of the tensors computed from neither them nor the parameters nor a floating-point buffer
(torch.arange, torch.full, masks, index buffers, what is computed from them), as torch computes
them on the example. The walk (lowering.py) skips them; an op that reads one reads it as a
buffer of the compiled model's own (Lowering.constant, Lowering.value)."""

from __future__ import annotations

import torch

from rootclad.ir.graph import IRError


def fold(low, needed: set[str]) -> None:
    """Which nodes the inputs' values reach (``low.data``), and the value of each constant the
    model needs (``low.folded``): a tensor computed from neither the inputs' values nor the
    parameters nor a floating-point buffer (torch.arange, torch.full, a mask, an index buffer
    and what is computed from them), as torch computes it on the example. One whose
    per-sample value changes with the batch size (torch.ones(B, 4).sum(0), a count of the
    batch) is no constant: it is lowered as computed from the inputs. Random draws never are."""
    _classify(low, set())  # what the inputs reach is no constant at any batch size
    first, sizes = _run(low, low.examples)
    again, _ = _run(low, tuple(torch.cat([x, x[:1]]) for x in low.examples))
    low.sizes.update(sizes)
    batch = len(low.examples[0])
    # torch.empty's values are whatever memory held: only its shape counts (stochastic depth
    # draws into it)
    empty = ("empty", "empty_like", "new_empty", "empty_strided", "empty_permuted")
    unset = {n.name for n in low.program.graph.nodes if getattr(n.target, "_opname", "") in empty}
    moving: set[str] = set()  # what depends on the batch size
    while True:
        trained = _classify(low, moving)
        more = {
            name
            for name, value in first.items()
            if name in needed
            and name not in low.data
            and name not in trained
            and name not in unset
            and not _same_per_sample(value, again[name], batch)
        }
        if more <= moving:
            break
        moving |= more
    for name, value in first.items():
        if name in needed and name not in low.data and name not in trained:
            low.folded[name] = value


# ops whose result is made from a tensor's shape alone, not its values
_SHAPED = (
    "full_like",
    "zeros_like",
    "ones_like",
    "empty_like",
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty",
    "sym_size",
    "sym_numel",
)


def _classify(low, moving: set[str]) -> set[str]:
    """Fill ``low.data`` (what the inputs' values, or the batch size through ``moving``,
    reach); returns what the parameters and floating-point buffers reach."""
    low.data.clear()
    trained = set(low.params)
    for node in low.program.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if node.name in low.user_inputs:
                low.data.add(node.name)
            elif node.name in low.buffers and val.dtype.is_floating_point:
                trained.add(node.name)  # read when the model runs: it may be loaded anew
            continue
        if node.op != "call_function":
            continue
        if node.name in moving:
            low.data.add(node.name)
        if getattr(node.target, "_opname", "") in _SHAPED:
            continue  # made from a tensor's shape alone
        reads = node.all_input_nodes
        if any(a.name in low.data for a in reads):
            low.data.add(node.name)
        if any(a.name in trained for a in reads):
            trained.add(node.name)
    return trained


def _same_per_sample(first: torch.Tensor, again: torch.Tensor, batch: int) -> bool:
    """Whether a tensor computed at batch sizes ``batch`` and ``batch + 1`` holds the same
    values per sample: equal where it has no batch axis; else one axis of k rows per sample,
    every sample's the same in both."""
    if first.shape == again.shape:
        return torch.equal(first, again) or bool(
            (first.isnan() & again.isnan() | (first == again)).all()
        )
    if first.dim() != again.dim():
        return False
    moved = [i for i, (a, b) in enumerate(zip(first.shape, again.shape, strict=True)) if a != b]
    if len(moved) != 1:
        return False
    p = moved[0]
    k = first.shape[p] // batch
    if first.shape[p] != k * batch or again.shape[p] != k * (batch + 1) or not first.numel():
        return False  # (an empty value: no sample's values to compare, and no constant)
    rows = [
        v.reshape(
            int(torch.tensor(v.shape[:p]).prod()),
            -1,
            k * int(torch.tensor(v.shape[p + 1 :]).prod()),
        )
        for v in (first, again)
    ]
    one = rows[0][:, :1]
    return all(bool((r == one).all()) for r in rows)


def _run(low, examples) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """The value of every tensor of the program that depends on no input's values and is
    not random, and of every size, computed by torch on ``examples``."""
    state, constants = low.program.state_dict, low.program.constants
    examples = iter(examples)
    args = [
        next(examples)
        if spec.kind.name == "USER_INPUT"
        else state[spec.target]
        if spec.target in state
        else constants[spec.target]
        for spec in low.program.graph_signature.input_specs
    ]
    skip = set(low.data) | set(low.params)  # never constants: not kept
    random, kept, sizes = set(), {}, {}

    at = []  # the node running

    class Run(torch.fx.Interpreter):
        def run_node(self, n):
            at[:] = [n]
            result = super().run_node(n)
            tags = getattr(n.target, "tags", ())
            if torch.Tag.nondeterministic_seeded in tags or any(
                a.name in random for a in n.all_input_nodes
            ):
                random.add(n.name)
            elif isinstance(result, torch.Tensor) and n.name not in skip:
                kept[n.name] = result.detach()
            elif isinstance(result, int):
                sizes[n.name] = result
            return result

    try:  # the caller's random state as it was (dropout and draws run too)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            Run(low.program.graph_module).run(*args)
    except Exception as exc:  # torch's own message names what failed
        where = f"{low.where(at[0])}: " if at else ""
        raise IRError(
            f"{where}torch could not run the captured program on the example (to compute its "
            f"constants): {type(exc).__name__}: {str(exc)[:1000]}"
        ) from exc
    return kept, sizes
