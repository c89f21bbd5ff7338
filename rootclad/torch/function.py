"""The compiled model as a ``torch.autograd.Function``.

Each call gets its own activation buffer, saved for backward, so several forward calls may
precede one backward (as in ``(cm(a) + cm(b)).sum().backward()``).
"""

from __future__ import annotations

import math

import torch

from rootclad.torch.model import fresh_copy


class CompiledFunction(torch.autograd.Function):
    """``apply(cm, n_inputs, *inputs, *params)``: the model output; the backward gives the
    gradients of the inputs and parameters torch asks for."""

    @staticmethod
    def forward(ctx, cm, n_inputs, *tensors):
        xs = tensors[:n_inputs]
        B = int(xs[0].shape[0])
        act = torch.empty(cm._lib.act_size(B), dtype=cm.dtype)
        cm._load_input(act, tuple(x.detach() for x in xs), B)
        seed = cm._next_seed()
        cm._lib.forward(cm._arena.data_ptr(), act.data_ptr(), B, int(cm.training), seed)
        ctx.cm, ctx.seed, ctx.B, ctx.n_inputs = cm, seed, B, n_inputs
        ctx.x_shapes = [x.shape for x in xs]
        ctx.training = cm.training
        ctx.save_for_backward(act)
        return fresh_copy(cm._output(act, B))

    @staticmethod
    def backward(ctx, d_out):
        if torch.is_grad_enabled():
            # create_graph=True: the C++ VJP is invisible to autograd, so any higher-order
            # gradient through it would silently miss this model's terms
            raise RuntimeError(
                "rootclad compiled models support first-order gradients only; "
                "create_graph=True (double backward, gradient penalties) is not supported"
            )
        cm, B, n = ctx.cm, ctx.B, ctx.n_inputs
        (act,) = ctx.saved_tensors
        need_x = ctx.needs_input_grad[2 : 2 + n]
        need_params = ctx.needs_input_grad[2 + n :]
        if not (any(need_x) or any(need_params)):
            return (None, None) + (None,) * (n + len(cm._views))
        d_act = torch.empty(cm._lib.d_act_size(B), dtype=cm.dtype)
        d_params = torch.empty_like(cm._grads)  # the parameters' and the buffers' slots
        d_out = d_out.to(cm.dtype).contiguous()
        cm._lib.vjp(
            cm._arena.data_ptr(),
            act.data_ptr(),
            d_params.data_ptr(),
            d_act.data_ptr(),
            d_out.data_ptr(),
            B,
            int(ctx.training),
            ctx.seed,
            int(any(need_x)),
        )
        d_xs = []
        for r, shape, needed in zip(cm._em.input_regions, ctx.x_shapes, need_x, strict=True):
            d = fresh_copy(d_act[B * r.d_offset : B * (r.d_offset + r.size)].view(shape))
            d_xs.append(d if needed else None)
        grads = []
        offsets = cm._em.param_offsets.values()
        for (off, shape), needed in zip(offsets, need_params, strict=True):
            grads.append(d_params[off : off + math.prod(shape)].view(shape) if needed else None)
        return (None, None, *d_xs, *grads)
