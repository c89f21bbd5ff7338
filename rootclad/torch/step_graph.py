"""A DeviceModel's training step replayed as one CUDA graph (``DeviceModel.cuda_graphs``).

At small batches a training step is many short kernels, whose launches, and the Python
around them, take longer than the kernels themselves. Captured once as a CUDA graph, the
step is one launch. A replay repeats every launch argument, so whatever changes from step to
step lives in memory that the graph reads: the inputs at their place in ``act`` (as always),
the targets in the graph's own buffer, and the optimizer's configuration and step count in
device memory (the program's ``optim_step_in_memory`` advances the count itself). Dropout's
seed is a launch argument, so a model with dropout is not captured; nor is a step where some
parameter is frozen (the optimizer's runs then vary). The first step at a batch size runs as
plain launches (it creates cuBLAS's handle, which a capture may not), the second captures.

On the CPU (the host loops, the tests' reference) the same in-memory step runs without a
graph, so all but the capture itself is tested on machines without a GPU.
"""

from __future__ import annotations

import torch


class StepGraph:
    """The training step of one batch size, training mode and optimizer."""

    def __init__(self, model, B: int, y: torch.Tensor, opt):
        self.model, self.B = model, B
        device = model.device
        self.y = torch.empty_like(y, memory_format=torch.contiguous_format)  # the targets
        self.step = torch.zeros(1, dtype=torch.int64, device=device)  # the optimizer's count
        self.config = torch.zeros(len(opt._cfg), dtype=torch.float64, device=device)
        size = model._fn["optim_constants_size"]()
        self.constants = torch.empty(size, dtype=torch.uint8, device=device)
        self.config_held: tuple | None = None  # what self.config holds
        self.step_held: int | None = None  # what self.step will hold at the next run
        self.graph = None  # the captured CUDA graph (on a GPU, after the first run)

    def run(self, work, y: torch.Tensor, opt, step: int) -> None:
        """One step on ``work`` (the batch's act and d_act, the inputs in place) and the
        checked targets ``y``, ``step`` being the optimizer's count for it."""
        self.y.copy_(y)
        if self.step_held != step:  # a step was taken without this graph
            self.step.fill_(step)
        config = tuple(opt._cfg)
        if config != self.config_held:  # e.g. a new learning rate
            self.config.copy_(torch.tensor(config, dtype=torch.float64))
            self.config_held = config
        self.step_held = None  # unknown until the step has been launched
        if self.model.device.type != "cuda":
            self._launch(work, opt)
        else:
            if self.graph is None:
                self.graph = self._capture(work, opt)
            self.graph.replay()
        self.step_held = step + 1

    def _launch(self, work, opt) -> None:
        m, ptr = self.model, self.model._ptr
        m._run("loss_and_grad", ptr["params"], ptr["buffers"], work.act_ptr, self.y.data_ptr(),
               None, ptr["loss"], ptr["grads"], work.d_act_ptr, self.B, int(m.training), 0)  # fmt: skip
        m._run("optim_step_in_memory", ptr["params"], ptr["grads"], opt._state.data_ptr(),
               self.config.data_ptr(), self.step.data_ptr(), self.constants.data_ptr(), 0,
               m.n_param_values)  # fmt: skip

    def _capture(self, work, opt):
        device = self.model.device
        graph = torch.cuda.CUDAGraph()
        stream, current = torch.cuda.Stream(device), torch.cuda.current_stream(device)
        stream.wait_stream(current)
        try:
            with torch.cuda.graph(graph, stream=stream):
                self._launch(work, opt)
        finally:  # a capture that fails at its end leaves torch on the capture's stream
            torch.cuda.set_stream(current)
        return graph
