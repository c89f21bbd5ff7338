"""A model's mode where its own code reads it: torch.export captures the branch of
``self.training`` that the model's mode takes, and a compiled model's train() and eval() switch
only what torch's own layers do by mode (dropout, BatchNorm, stochastic depth). A layer of the
user's (or of a library's) whose forward read ``self.training`` during the capture may compute
otherwise in the other mode: the compiled model captures that mode too when it is first
switched to it, and refuses the switch where the two lower to different graphs."""

from __future__ import annotations

import contextlib

from torch import nn


@contextlib.contextmanager
def training_reads(module: nn.Module, found: list[str]):
    """While the block runs, each layer of ``module`` that is not torch's own records its path
    in ``found`` when its ``training`` is read (the layer's class stands in for a subclass of
    the same name whose ``training`` is a property; put back after, whatever happens)."""
    swapped = []
    try:
        for path, layer in module.named_modules():
            cls = type(layer)
            if cls.__module__.startswith("torch.") or "training" not in layer.__dict__:
                continue
            if getattr(cls, "_rootclad_reads", False):  # another capture's, running now
                continue

            def read(self, path=path):
                if path not in found:
                    found.append(path)
                return self.__dict__["training"]

            def write(self, value):
                self.__dict__["training"] = value

            body = {"training": property(read, write), "_rootclad_reads": True}
            try:  # (a class that cannot stand in so, by its slots or metaclass: not watched)
                spy = type(cls.__name__, (cls,), body)
                spy.__module__, spy.__qualname__ = cls.__module__, cls.__qualname__
                layer.__class__ = spy
            except TypeError:
                continue
            swapped.append((layer, cls))
        yield
    finally:
        for layer, cls in swapped:
            layer.__class__ = cls


def canonical(graph) -> list:
    """The graph's nodes with values named by position and folded constants by their values
    (a capture in another mode names its nodes otherwise): what two graphs of one model share
    where they compute the same."""
    index = {name: f"input{i}" for i, name in enumerate(graph.inputs)}

    def tensor(name):
        value = graph.constants.get(name)
        if value is None:
            return name
        return (tuple(value.shape), str(value.dtype), hash(value.detach().cpu().numpy().tobytes()))

    out = []
    for i, node in enumerate(graph.nodes):
        reads = tuple(index.get(v, v) for v in node.inputs)
        held = [(role, tensor(name)) for role, name in sorted(node.buffers.items())]
        out.append(
            (node.op, repr(sorted(node.attrs.items())), reads, sorted(node.params.items()), held)
        )
        index[node.output] = f"value{i}"
    shapes = (tuple(map(tuple, graph.input_shapes)), graph.masks, graph.indices)
    return [*out, index.get(graph.output, graph.output), graph.parts, graph.container, shapes]
