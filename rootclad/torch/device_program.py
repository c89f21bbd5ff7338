"""A model's device program (rootclad/codegen/device.py), built and run from Python.

``DeviceProgram(net, example_input, device=...)`` builds the program for the device of
``device``: ``"cuda"`` compiles it with nvcc and runs every kernel on the GPU, on torch's
current stream, with the parameters, activations and Adam's moments in device memory (no
copy between host and device per step; the loss stays a device tensor until read);
``"cpu"`` compiles the same source with the C++ compiler, each kernel then a loop on the
calling thread (dev::Host): the reference the GPU build is checked against, and what tests
run on machines without a GPU. This is the CUDA issue's first step: the GW models' ops and
BCE with logits, plain kernels (no cuBLAS, no arena plan), not yet behind ``rootclad.compile``.
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import math

import torch

import rootclad
from rootclad.codegen.device import emit_device
from rootclad.ir.from_torch import graph_from_module
from rootclad.toolchain import ToolchainError, build_library, find_cxx, find_nvcc

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def _nvcc_flags() -> list[str]:
    major, minor = torch.cuda.get_device_capability()
    return ["-O3", "-std=c++17", "--extended-lambda", f"-arch=sm_{major}{minor}",
            f"-I{rootclad.get_include()}"]  # fmt: skip


class DeviceProgram:
    """The model's forward pass, loss gradient and Adam step as device kernels.

    ``device``: ``"cuda"`` (nvcc, an NVIDIA GPU) or ``"cpu"`` (the same kernels as loops).
    Parameters are copied from ``net`` once; :meth:`state_dict` gives them back."""

    def __init__(self, net: torch.nn.Module, example_input: torch.Tensor, device="cuda",
                 loss: str = "bce_with_logits"):  # fmt: skip
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device {device!r}: a device program runs on 'cuda' or 'cpu'")
        dtype = example_input.dtype
        if dtype not in _DTYPES:
            raise TypeError(f"dtype {dtype} is not supported; use torch.float32 or torch.float64")
        if self.device.type == "cuda":
            if find_nvcc() is None:
                raise ToolchainError(
                    "device='cuda' needs nvcc (the CUDA toolkit) to build the kernels and found "
                    "none: put nvcc on PATH or set ROOTCLAD_NVCC"
                )
            if not torch.cuda.is_available():
                raise RuntimeError(
                    "device='cuda' but torch sees no CUDA device on this machine (a CPU-only "
                    "torch, no GPU, or no driver); use device='cpu'"
                )
        example = example_input.detach().cpu()
        if any(p.device.type != "cpu" for p in net.parameters()):
            net = copy.deepcopy(net).cpu()  # traced on the CPU; the caller's stays where it is
        graph = graph_from_module(net, example, _DTYPES[dtype])
        graph.validate()
        self.dtype, self.input_shape = dtype, tuple(graph.input_shapes[0])
        name = "rcd_" + hashlib.sha256(graph.fingerprint().encode()).hexdigest()[:12]
        source = emit_device(graph, name, loss)
        if self.device.type == "cuda":
            path, _ = build_library(source, name=name, cxx=find_nvcc()[0], flags=_nvcc_flags(),
                                    suffix=".cu")  # fmt: skip
        else:
            path, _ = build_library(source, name=name, cxx=find_cxx()[0],
                                    flags=["-O2", "-std=c++17", f"-I{rootclad.get_include()}"])  # fmt: skip
        self.library_path = path
        self._lib = lib = ctypes.CDLL(str(path))
        self._fn = {k: getattr(lib, f"{name}_{k}") for k in
                    ("n_params", "act_size", "output_offset", "forward", "loss_and_grad", "adam")}  # fmt: skip
        for k in ("n_params", "act_size", "output_offset"):
            self._fn[k].restype = ctypes.c_long
        self._fn["adam"].argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_double] * 5 + [ctypes.c_long]
        self._names = [p.name for p in graph.params]
        self._param_shapes = {p.name: p.shape for p in graph.params}
        tensors = dict(net.named_parameters())
        self.params = torch.cat([tensors[n].detach().reshape(-1) for n in self._names]).to(
            self.device, dtype
        )
        assert self.params.numel() == self._fn["n_params"]()
        self.d_params = torch.zeros_like(self.params)
        self._m, self._v = torch.zeros_like(self.params), torch.zeros_like(self.params)
        self._loss = torch.zeros(1, dtype=dtype, device=self.device)
        self._work: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.steps = 0

    # -- checking ---------------------------------------------------------------------------
    def _check(self, t: torch.Tensor, what: str, shape: tuple) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != self.device and not (
            t.device.type == self.device.type == "cuda" and self.device.index is None
        ):
            raise ValueError(
                f"{what} is on {t.device}; this program runs on {self.device} (move it with "
                f".to({str(self.device)!r}))"
            )
        if t.dtype != self.dtype:
            raise TypeError(f"{what} dtype is {t.dtype}, expected {self.dtype}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{what} has shape {tuple(t.shape)}, expected {shape}")
        return t.contiguous()

    def _stream(self):
        if self.device.type != "cuda":
            return None
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def _buffers(self, x: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        if x.dim() != len(self.input_shape) + 1 or x.shape[0] < 1:
            raise ValueError(f"input has shape {tuple(x.shape)}, expected (B, "
                             f"{', '.join(map(str, self.input_shape))})")  # fmt: skip
        B = int(x.shape[0])
        x = self._check(x, "input", (B, *self.input_shape))
        if B not in self._work:
            n = self._fn["act_size"](B)
            self._work[B] = (torch.empty(n, dtype=self.dtype, device=self.device),
                             torch.empty(n, dtype=self.dtype, device=self.device))  # fmt: skip
        act, d_act = self._work[B]
        act[: x.numel()].copy_(x.reshape(-1))  # on the same stream as the kernels
        return B, act, d_act

    @staticmethod
    def _p(t: torch.Tensor) -> ctypes.c_void_p:
        return ctypes.c_void_p(t.data_ptr())

    # -- running ----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model output (B, 1) for a batch on this program's device."""
        B, act, _ = self._buffers(x)
        self._fn["forward"](self._stream(), self._p(self.params), self._p(act), B)
        at = self._fn["output_offset"](B)
        return act[at : at + B].reshape(B, 1).clone()

    def loss_and_grad(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's mean BCE-with-logits loss (a device tensor) and the flat gradient of
        the parameters (``d_params``, in :meth:`state_dict`'s order)."""
        B, act, d_act = self._buffers(x)
        y = self._check(y, "targets", (B,))
        self._fn["loss_and_grad"](self._stream(), self._p(self.params), self._p(act), self._p(y),
                                  self._p(self._loss), self._p(self.d_params), self._p(d_act), B)  # fmt: skip
        return self._loss[0], self.d_params

    def train_step(self, x, y, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        """Forward, backward and an Adam update (as torch.optim.Adam), all on the device;
        returns the loss as a device tensor (reading it waits for the step)."""
        loss, _ = self.loss_and_grad(x, y)
        loss = loss.clone()
        self.steps += 1
        self._fn["adam"](self._stream(), self._p(self.params), self._p(self.d_params),
                         self._p(self._m), self._p(self._v), lr, betas[0], betas[1], eps,
                         weight_decay, self.steps)  # fmt: skip
        return loss

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The parameters by their torch names, as views of the program's own."""
        out, off = {}, 0
        for n in self._names:
            shape = self._param_shapes[n]
            size = math.prod(shape)
            out[n] = self.params[off : off + size].view(shape)
            off += size
        return out
