"""The compiled model as a ``torch.autograd.Function``.

Each call gets its own activation buffer, saved for backward, so several forward calls may
precede one backward (as in ``(cm(a) + cm(b)).sum().backward()``).
"""

from __future__ import annotations

import math

import torch


class CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cm, *params):
        B = int(x.shape[0])
        act = torch.empty(cm._lib.act_size(B), dtype=cm.dtype)
        cm._load_input(act, x.detach(), B)
        seed = cm._next_seed()
        cm._lib.forward(cm._params.data_ptr(), act.data_ptr(), B, int(cm.training), seed)
        ctx.cm, ctx.seed, ctx.B, ctx.x_shape = cm, seed, B, x.shape
        ctx.training = cm.training
        ctx.save_for_backward(act)
        return cm._output(act, B).clone()

    @staticmethod
    def backward(ctx, d_out):
        if torch.is_grad_enabled():
            # create_graph=True: the C++ VJP is invisible to autograd, so any higher-order
            # gradient through it would silently miss this model's terms
            raise RuntimeError(
                "rootclad compiled models support first-order gradients only; "
                "create_graph=True (double backward, gradient penalties) is not supported"
            )
        cm, B = ctx.cm, ctx.B
        (act,) = ctx.saved_tensors
        need_dx = bool(ctx.needs_input_grad[0])
        need_params = any(ctx.needs_input_grad[2:])
        if not (need_dx or need_params):
            return (None, None) + (None,) * len(cm._views)
        d_act = torch.empty_like(act)
        d_params = torch.empty_like(cm._params)
        d_out = d_out.to(cm.dtype).contiguous()
        cm._lib.vjp(
            cm._params.data_ptr(),
            act.data_ptr(),
            d_params.data_ptr(),
            d_act.data_ptr(),
            d_out.data_ptr(),
            B,
            int(ctx.training),
            ctx.seed,
            int(need_dx),
        )
        d_x = None
        if need_dx:
            r = cm._em.input_region
            d_x = d_act[B * r.offset : B * (r.offset + r.size)].view(ctx.x_shape).clone()
        grads = []
        offsets = cm._em.param_offsets.values()
        for (off, shape), needed in zip(offsets, ctx.needs_input_grad[2:], strict=True):
            grads.append(d_params[off : off + math.prod(shape)].view(shape) if needed else None)
        return (d_x, None, *grads)
