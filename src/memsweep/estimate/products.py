"""A step's products, and its ops whose time is math per element, as this CPU can run them again: the record
(op_record.py) keeps each product the traced step calls (mm, addmm, bmm, baddbmm: a linear layer's forward and
both its gradients, attention's batched products) and each op of MATH with its operands' shapes, strides and
dtype, so that a CPU step times each at its own shape on this CPU (measure/peak.product_s) instead of at a
1,024-square product's rate (a product's best) or, for MATH, at its bytes (MATH: softmax, GELU, SiLU, tanh,
sigmoid, exp, erf and GELU's and SiLU's gradients evaluate an exponential, erf or tanh per element, for which
torch.utils.flop_counter has no formula, so the roofline counts only their bytes: MiniLM's softmax at 32 x 64
tokens took 12.8 times its bytes' time on this CPU, GELU 2.7 and its gradient 2.8 times)."""

import torch

PRODUCTS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm)
# an exponential, erf or tanh per element (softmax's and tanh's gradients are products and sums of their outputs)
MATH = tuple(getattr(torch.ops.aten, name) for name in (
    "_softmax", "_safe_softmax", "_log_softmax", "gelu", "gelu_backward", "silu", "silu_backward", "tanh",
    "sigmoid", "exp", "erf"))
TIMED = PRODUCTS + MATH


def operands(args, kwargs) -> tuple | None:
    """A timed op's arguments as this CPU can make them again: each tensor's (shape, strides, dtype), each
    scalar, string or None as it is; None where an argument is none of these (no such op is timed)."""
    out = []
    for name, value in [*((None, arg) for arg in args), *sorted((kwargs or {}).items())]:
        if isinstance(value, torch.Tensor):
            value = ("tensor", tuple(value.shape), tuple(value.stride()), str(value.dtype).removeprefix("torch."))
        elif value is not None and not isinstance(value, (int, float, bool, str)):
            return None
        out.append((name, value))
    return tuple(out)


def reading(roofline) -> list:
    """The products as the trace stores them: [phase, op, operands, dtype key, FLOPs, bytes, count] each."""
    return [[*key, n] for key, n in roofline.products.items() if key[2] is not None]
