"""The record of a traced step's ops that the roofline (roofline.py) times: each ATen op's phase, compute dtype,
FLOPs (the formulas of `torch.utils.flop_counter`) and bytes moved (the count of
`torch.utils._runtime_estimation`), taken by torch's RuntimeEstimator in its cost-model mode
(`torch/distributed/_tools/runtime_estimator.py`: its dispatch and its ignored view/creation ops) on the
trace's fake tensors, without rates: one record serves every profile of its device.

The ops are those eager PyTorch runs as kernels: no mode sits above the roofline. torch's FlopCounterMode
decomposes an op it has no formula for (`func.decompose`: silu_backward into 8 elementwise ops, each timed
as a kernel of its own), so the step's FLOPs are read off this record (`micro_batch_flops`, the same
formulas) instead of counted by it.
"""
import contextlib
from collections import Counter
from typing import NamedTuple

import torch
from torch._guards import active_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.runtime_estimator import RuntimeEstimator
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from ..measure import peak
from . import products

PHASES = ("forward", "backward", "accumulate", "step")
RANDOM = "random"  # an op's record whose count is random numbers drawn, not FLOPs
FLOAT_KEYS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


class OpCost(NamedTuple):
    """One op as the roofline times it (Roofline.sequence holds one per op run, in order)."""
    phase: str  # PHASES: the part of the step that ran it
    dtype: str  # the compute dtype key it runs at (FLOAT_KEYS' values), RANDOM for random draws, "-" for no FLOPs
    flops: int  # by torch.utils.flop_counter's formulas; under RANDOM the numbers drawn
    moved: int  # bytes read and written (moved_bytes)


class CountedOp(NamedTuple):
    """The record's row (reading): the ops of one cost, and how many of them the traced step runs."""
    phase: str
    dtype: str
    flops: int
    moved: int
    times: int


class Roofline(RuntimeEstimator):
    """torch's RuntimeEstimator recording each op's FLOPs, compute dtype and bytes moved, without rates: one
    trace serves every profile of its device (core.estimate_job's memo), each timing it at its own rates
    (roofline.seconds). `mark` takes the step's marks (step.training_step calls it), so the time is split into
    forward, backward (with recomputation), the adds of accumulation (`tag_grads`) and the optimizer step."""

    def __init__(self, on_cpu: bool = False):
        super().__init__()
        self.on_cpu = on_cpu  # an output written over an input moves no bytes of its own (moved_bytes)
        self.ops: Counter[OpCost] = Counter()  # each op's cost -> how many ops
        self.phase = "forward"
        self.sequence: list[OpCost] = []  # the same, one per op in the order run (planner/batch.py reads it)
        # each product's call as this CPU can run it again (timed_products) -> how many calls
        self.products: Counter[products.ProductCall] = Counter()
        self.accumulated = False
        # ops a module's forward runs inside the backward: activation checkpointing's recomputation (no other
        # forward runs there), whose saved-tensor hooks cost the host more than a plain op (peak.recomputed_op_s)
        self.recomputed, self._in_forward, self._hooks = 0, 0, []
        self._estimate, self._estimate_mode_type = self.op_cost, "operator-level-cost-model"

    def mark(self, name: str) -> None:
        if name in PHASES:
            self.phase = name

    def tag_grads(self, model) -> None:
        """The gradients the first micro-batch's backward left: a later micro-batch of the same step adds its own
        into each (autograd's AccumulateGrad: `variable_grad += new_grad`, one add per parameter, reading both
        and writing the first), recorded as the phase "accumulate" that each micro-batch after the first runs.
        Under FSDP2 a micro-batch keeps the whole gradients until the step's last has added its own
        (sharded.no_sync), so each add is a whole parameter's, where the traced micro-batch left this rank's shard."""
        if self.accumulated:
            return
        self.accumulated = True
        for param in model.parameters():
            if param.grad is not None:
                grad = param.grad  # a DTensor's numel is the whole parameter's
                # `grad += new_grad` as op_cost counts an op (the new gradient is the same size)
                op = OpCost("accumulate", "-", 0, moved_bytes((grad, grad), {}, grad, self.on_cpu))
                self.ops[op] += 1
                self.sequence.append(op)

    def op_cost(self, func, args, kwargs):
        """(the op's output, 0 ms): RuntimeEstimator's estimator interface; the cost is recorded, timed later."""
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not peak.launches(func):
            return out, 0.0
        dtype, flops, moved = priced(func, args, kwargs, out, self.on_cpu)
        cost = OpCost(self.phase, dtype, flops, int(moved))
        self.ops[cost] += 1
        self.recomputed += self.phase == "backward" and self._in_forward > 0
        if func._overloadpacket in products.TIMED:
            operands = products.operands(args, kwargs)
            self.products[products.ProductCall(self.phase, str(func), operands, dtype, flops, cost.moved)] += 1
        self.sequence.append(cost)
        return out, 0.0

    def __enter__(self):
        # RuntimeEstimator's own __enter__ also enters its ModTracker with hooks that record the modules'
        # order (unused here; and its backward hook fails on a module it never saw, e.g. under the ledger's
        # own tracker): only its fake-mode check and the dispatch mode are kept
        if not isinstance(active_fake_mode(), FakeTensorMode):
            raise AssertionError("the roofline runs on the trace's fake tensors")
        RuntimeEstimator.fake_mode = active_fake_mode()
        self._hooks = [register_module_forward_pre_hook(lambda *_: self._forward(1)),
                       register_module_forward_hook(lambda *_: self._forward(-1), always_call=True)]
        TorchDispatchMode.__enter__(self)
        return self

    def __exit__(self, *args) -> None:
        # RuntimeEstimator's own __exit__ prints its total; the estimate reports it instead
        TorchDispatchMode.__exit__(self, *args)
        for hook in self._hooks:
            hook.remove()

    def _forward(self, step: int) -> None:
        self._in_forward += step


def priced(func, args, kwargs, out, on_cpu: bool) -> tuple[str, int, int]:
    """An op's record without its phase: (compute dtype key, FLOPs, bytes moved). FLOPs by torch.utils.flop_counter's
    formulas where it has one; CPU dropout's mask counts its random draws instead (RANDOM), one per element."""
    from torch.utils.flop_counter import flop_registry

    packet, flops, key = func._overloadpacket, 0, "-"
    if packet in flop_registry:
        flops, key = int(flop_registry[packet](*args, **kwargs, out_val=out)), dtype_key(args)
    elif packet in (torch.ops.aten.bernoulli, torch.ops.aten.bernoulli_):
        flops, key = out.numel(), RANDOM
    return key, flops, moved_bytes(args, kwargs, out, on_cpu)


def dtype_key(args) -> str:
    """The compute dtype of a FLOP-counted op: its first operand's (a matmul's, a convolution's input, an
    attention's query or, backward, its output gradient), which its kernel computes in. Not its outputs':
    flash attention returns its log-sum-exp in fp32 beside a bf16 output, and is no fp32 matmul for that."""
    import torch.utils._pytree as pytree

    for t in pytree.tree_leaves(args):
        if isinstance(t, torch.Tensor) and t.dtype in FLOAT_KEYS:
            return FLOAT_KEYS[t.dtype]
    return "fp32"


def moved_bytes(args, kwargs, out, on_cpu: bool) -> int:
    """The bytes an op moves (torch.utils._runtime_estimation's count of its inputs and outputs). On a CPU an output
    written over an input (add_, copy_'s destination, an out= tensor) is counted once, as an input: a core reads
    each line in before writing it, a fresh output's too (write-allocate), and writes it back from the cache while
    it goes on reading, so its memory time is the lines it reads in. One thread here read 20 GB/s summing, copied
    19.6 GB/s counting source and destination, and added in place at 31 GB/s counting the three tensors (20.7 of
    them read). A GPU's traffic is each input and output once."""
    import torch.utils._pytree as pytree
    from torch.utils._runtime_estimation import get_num_bytes

    inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    if on_cpu:
        read = {id(t) for t in inputs}
        outputs = [t for t in outputs if id(t) not in read]
    return sum(get_num_bytes(t) for t in inputs + outputs)


@contextlib.contextmanager
def recording(on_cpu: bool = False):
    """The roofline's record of the ops inside (the trace's fake mode must be active), as `on_cpu`'s memory
    moves their bytes (moved_bytes) or a GPU's."""
    with Roofline(on_cpu) as roofline:
        yield roofline


def reading(roofline: Roofline) -> list[CountedOp]:
    """The record as the trace stores it: each distinct op cost with its count, in the costs' order."""
    return [CountedOp(*cost, n) for cost, n in sorted(roofline.ops.items())]


def micro_batch_flops(ops: list[CountedOp]) -> int:
    """The FLOPs of one micro-batch's forward and backward in the record: each op's by
    torch.utils.flop_counter's formulas, as FlopCounterMode counts them (the optimizer step's ops have none)."""
    return sum(op.flops * op.times for op in ops if op.phase in ("forward", "backward") and op.dtype != RANDOM)
