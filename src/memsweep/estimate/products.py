"""A step's products as this CPU can run them again: the record (op_record.py) keeps each product the
traced step calls (mm, addmm, bmm, baddbmm: a linear layer's forward and both its gradients, attention's
batched products) with its operands' shapes, strides and dtype, so that a CPU step times each at its own shape
on this CPU (measure/peak.product_s) instead of at a 1,024-square product's rate, a product's best."""
from typing import Optional

import torch

PRODUCTS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm)


def operands(args, kwargs) -> Optional[tuple]:
    """A product's arguments as this CPU can make them again: each tensor's (shape, strides, dtype), each
    scalar as it is; None where an argument is neither (no such product is timed)."""
    out = []
    for name, value in [*((None, arg) for arg in args), *sorted((kwargs or {}).items())]:
        if isinstance(value, torch.Tensor):
            value = ("tensor", tuple(value.shape), tuple(value.stride()), str(value.dtype).removeprefix("torch."))
        elif not isinstance(value, (int, float, bool)):
            return None
        out.append((name, value))
    return tuple(out)


def reading(roofline) -> list:
    """The products as the trace stores them: [phase, op, operands, dtype key, FLOPs, bytes, count] each."""
    return [[*key, n] for key, n in roofline.products.items() if key[2] is not None]
