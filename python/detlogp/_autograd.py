"""The autograd Function of the object API (``LogprobOp``, _op.py): a prepared call object that
knows its own forward and backward; this Function only connects it to autograd. ``detlogp.torch``
and the fused lm_head connect the same kind of call object (same ``forward``, ``backward`` and
``constant_outputs``) through their torch.library custom ops instead (_ops.py), which
``torch.compile`` can hold in a graph.

A call object has ``forward(inputs)`` (the outputs, a tuple of tensors), ``constant_outputs``
(indices of outputs without a gradient, e.g. an entropy logged as a metric) and
``backward(inputs, grads, needs)`` (one gradient or None per input; ``needs[i]``: whether
input i wants one). Backward is never called with no incoming gradient at all.

Imported only where a tensor requires grad (then torch is imported; the package itself runs
without torch).
"""

import torch
from torch.autograd.function import once_differentiable


class _CallFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, call, *inputs):
        outputs = call.forward(inputs)
        ctx.call = call
        ctx.save_for_backward(*inputs)  # keeps them alive; detects in-place changes
        ctx.set_materialize_grads(False)
        constant = [outputs[i] for i in call.constant_outputs if i < len(outputs)]
        if constant:
            ctx.mark_non_differentiable(*constant)
        return outputs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        inputs = ctx.saved_tensors  # raises if an input was modified in place since forward
        if all(g is None for g in grads):
            return (None,) * (1 + len(inputs))
        return (None,) + tuple(ctx.call.backward(inputs, grads, ctx.needs_input_grad[1:]))


def apply(call, *inputs):
    """``call``'s outputs (a tuple), attached to autograd through ``inputs``."""
    outputs = _CallFunction.apply(call, *inputs)
    return outputs if isinstance(outputs, tuple) else (outputs,)
