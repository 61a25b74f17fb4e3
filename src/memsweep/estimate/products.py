"""A step's products, and its ops whose time is math per element, as this CPU can run them again: the record
(op_record.py) keeps each product the traced step calls (mm, addmm, bmm, baddbmm: a linear layer's forward and
both its gradients, attention's batched products) and each op of MATH with its operands' shapes, strides and
dtype, so that a CPU step times each at its own shape on this CPU (measure/peak.product_s) instead of at a
1,024-square product's rate (a product's best) or, for MATH, at its bytes (MATH: softmax, GELU, SiLU, tanh,
sigmoid, exp, erf and GELU's and SiLU's gradients evaluate an exponential, erf or tanh per element, for which
torch.utils.flop_counter has no formula, so the roofline counts only their bytes: MiniLM's softmax at 32 x 64
tokens took 12.8 times its bytes' time on this CPU, GELU 2.7 and its gradient 2.8 times)."""
from typing import NamedTuple

import torch

from ..measure.peak import Operand, TensorSpec

PRODUCTS = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm)
# an exponential, erf or tanh per element (softmax's and tanh's gradients are products and sums of their outputs)
MATH = tuple(getattr(torch.ops.aten, name) for name in (
    "_softmax", "_safe_softmax", "_log_softmax", "gelu", "gelu_backward", "silu", "silu_backward", "tanh",
    "sigmoid", "exp", "erf"))
TIMED = PRODUCTS + MATH


class ProductCall(NamedTuple):
    """One timed op's call (products.TIMED) as the record keeps it (op_record.Roofline.products counts them)."""
    phase: str  # op_record.PHASES
    op: str  # the overload's name, "aten.mm.default"
    operands: tuple[Operand, ...] | None  # None where an argument cannot be made again (then it is not timed)
    dtype: str  # as op_record.OpCost's
    flops: int
    moved: int


class CountedProduct(NamedTuple):
    """The products' row (reading): the calls of one op at one shape, and how many of them the traced step runs."""
    phase: str
    op: str
    operands: tuple[Operand, ...]
    dtype: str
    flops: int
    moved: int
    times: int


def operands(args, kwargs) -> tuple[Operand, ...] | None:
    """A timed op's arguments as this CPU can make them again: each tensor's (shape, strides, dtype), each
    scalar, string or None as it is; None where an argument is none of these (no such op is timed)."""
    out = []
    for name, value in [*((None, arg) for arg in args), *sorted((kwargs or {}).items())]:
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            value = TensorSpec("tensor", tuple(value.shape), tuple(value.stride()), dtype)
        elif value is not None and not isinstance(value, (int, float, bool, str)):
            return None
        out.append(Operand(name, value))
    return tuple(out)


def reading(roofline) -> list[CountedProduct]:
    """The products as the trace stores them: each call that can be made again, with its count."""
    return [CountedProduct(*call, n) for call, n in roofline.products.items() if call.operands is not None]
