"""A compiled model as a ``torch.autograd.Function``.

The Function asks the model for two things: ``autograd_forward(xs)`` (the output, and what
the backward will need of this call) and ``autograd_backward(saved, d_out, need_x,
need_params)`` (the inputs' and parameters' gradients). Each call keeps its own activations,
so several forward calls may precede one backward (as in ``(cm(a) + cm(b)).sum().backward()``).
"""

from __future__ import annotations

import torch


class CompiledFunction(torch.autograd.Function):
    """``apply(model, n_inputs, with_params, *inputs, *params)``: the model output; the
    backward gives the gradients of the inputs (and, ``with_params``, the parameters) that
    torch asks for."""

    @staticmethod
    def forward(ctx, model, n_inputs, with_params, *tensors):
        out, saved = model.autograd_forward(tensors[:n_inputs])
        ctx.model, ctx.n_inputs, ctx.saved = model, n_inputs, saved
        ctx.n_params = len(tensors) - n_inputs
        return out

    @staticmethod
    def backward(ctx, d_out):
        if torch.is_grad_enabled():
            # create_graph=True: the C++ VJP is invisible to autograd, so any higher-order
            # gradient through it would silently miss this model's terms
            raise RuntimeError(
                "rootclad compiled models support first-order gradients only; "
                "create_graph=True (double backward, gradient penalties) is not supported"
            )
        n = ctx.n_inputs
        need_x = ctx.needs_input_grad[3 : 3 + n]
        need_params = ctx.needs_input_grad[3 + n :]
        if not (any(need_x) or any(need_params)):
            return (None, None, None) + (None,) * (n + ctx.n_params)
        d_xs, grads = ctx.model.autograd_backward(ctx.saved, d_out, need_x, need_params)
        return (None, None, None, *d_xs, *grads)
