"""Step time predicted per operation on the trace's fake step: a roofline.

Each ATen op the step runs takes max(FLOPs / peak compute, bytes moved / memory bandwidth), as torch's
RuntimeEstimator does in its cost-model mode (`torch/distributed/_tools/runtime_estimator.py`, with the
FLOP formulas of `torch.utils.flop_counter` and the byte count of `torch.utils._runtime_estimation`).
It is built on that class (its dispatch, module tracking and ignored view/creation ops); only the rates
differ: they come from the hardware profile instead of the GPU this process runs on (there is none), and
no efficiency factor is applied (torch's `flops_to_ns` takes 75 % of peak, a factor without a named
mechanism), so every figure is what the op would take at the datasheet's rates: a lower bound per op,
summed over the ops as a GPU runs them one after another on one stream.

What the sum holds, because it is the step the memory trace runs: forward, backward with checkpointing's
recomputed forward, gradient clipping, the optimizer step (memory-bound: it reads and writes every state
tensor) and bitsandbytes' quantize / dequantize ops (each dispatched as an op with its bytes). What it
adds outside the ops: activation offload's host copies over the profile's host link. What it leaves out:
kernel launch latency and Python time between ops, data loading, and collectives between processes. So the
step also says how many ops a micro-batch dispatches and their mean time on the GPU (`gpu_us_per_op`):
where that is a few microseconds, eager PyTorch's dispatch of each op on the host (several microseconds
an op) sets the pace, not the GPU, and the figure is well below what a run takes.

The ops are those eager PyTorch runs as kernels: no mode sits above the roofline. torch's FlopCounterMode
decomposes an op it has no formula for (`func.decompose`: silu_backward into 8 elementwise ops, each timed
as a kernel of its own), so the step's FLOPs are read off this record (`micro_batch_flops`, the same
formulas) instead of counted by it.
"""
import contextlib
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import torch
from torch._guards import active_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.runtime_estimator import RuntimeEstimator
from torch.utils._python_dispatch import TorchDispatchMode

GB = 1e9
PHASES = ("forward", "backward", "step")
FLOAT_KEYS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


@dataclass(frozen=True)
class Rates:
    flops: dict[str, float]  # peak FLOP/s per compute dtype key (fp32, tf32, fp16, bf16)
    memory_bytes_s: float  # device memory bandwidth
    host_bytes_s: Optional[float]  # host link (PCIe) bandwidth, one direction
    fp32_key: str = "fp32"  # "tf32" where fp32 matmuls run on TF32 tensor cores
    source: str = "profile (datasheet)"


class Roofline(RuntimeEstimator):
    """torch's RuntimeEstimator recording each op's FLOPs, compute dtype and bytes moved, without rates: one
    trace serves every profile of its device (core.estimate_job's memo), each timing it at its own rates
    (`seconds`). `mark` takes the step's marks (step.training_step calls it), so the time is split into
    forward, backward (with recomputation) and the optimizer step."""

    def __init__(self):
        super().__init__()
        self.ops, self.phase = Counter(), "forward"  # (phase, dtype key, FLOPs, bytes) -> how many ops
        self.sequence: list[tuple] = []  # the same, one per op in the order run (planner/batch.py reads it)
        self._estimate, self._estimate_mode_type = self.op_cost, "operator-level-cost-model"

    def mark(self, name: str) -> None:
        if name in PHASES:
            self.phase = name

    def tag_grads(self, model) -> None:
        pass

    def op_cost(self, func, args, kwargs):
        """(the op's output, 0 ms): RuntimeEstimator's estimator interface; the cost is recorded, timed later."""
        import torch.utils._pytree as pytree
        from torch.utils._runtime_estimation import _IGNORE_OPS, get_num_bytes
        from torch.utils.flop_counter import flop_registry

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        # prim ops (prim.device, prim.layout) are the dispatcher asking a tensor subclass (here the fake tensors)
        # for its metadata; a real tensor reads a field: no kernel, no bytes (counted, each read the whole tensor)
        if packet in _IGNORE_OPS or func.namespace == "prim":
            return out, 0.0
        moved = sum(get_num_bytes(t) for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor))
        flops, key = 0, "-"
        if packet in flop_registry:
            flops, key = int(flop_registry[packet](*args, **kwargs, out_val=out)), dtype_key(args)
        self.ops[(self.phase, key, flops, int(moved))] += 1
        self.sequence.append((self.phase, key, flops, int(moved)))
        return out, 0.0

    def __enter__(self):
        # RuntimeEstimator's own __enter__ also enters its ModTracker with hooks that record the modules'
        # order (unused here; and its backward hook fails on a module it never saw, e.g. under the ledger's
        # own tracker): only its fake-mode check and the dispatch mode are kept
        if not isinstance(active_fake_mode(), FakeTensorMode):
            raise AssertionError("the roofline runs on the trace's fake tensors")
        RuntimeEstimator.fake_mode = active_fake_mode()
        TorchDispatchMode.__enter__(self)
        return self

    def __exit__(self, *args) -> None:
        # RuntimeEstimator's own __exit__ prints its total; the estimate reports it instead
        TorchDispatchMode.__exit__(self, *args)


def dtype_key(args) -> str:
    """The compute dtype of a FLOP-counted op: its first operand's (a matmul's, a convolution's input, an
    attention's query or, backward, its output gradient), which its kernel computes in. Not its outputs':
    flash attention returns its log-sum-exp in fp32 beside a bf16 output, and is no fp32 matmul for that."""
    import torch.utils._pytree as pytree

    for t in pytree.tree_leaves(args):
        if isinstance(t, torch.Tensor) and t.dtype in FLOAT_KEYS:
            return FLOAT_KEYS[t.dtype]
    return "fp32"


@contextlib.contextmanager
def recording():
    """The roofline's record of the ops inside (the trace's fake mode must be active)."""
    with Roofline() as roofline:
        yield roofline


def reading(roofline: Roofline) -> list:
    """The record as the trace stores it: [phase, dtype key, FLOPs, bytes, count] per distinct op cost."""
    return [[*key, n] for key, n in sorted(roofline.ops.items())]


def micro_batch_flops(ops: list) -> int:
    """The FLOPs of one micro-batch's forward and backward in the record: each op's by
    torch.utils.flop_counter's formulas, as FlopCounterMode counts them (the optimizer step's ops have none)."""
    return sum(flops * n for phase, _, flops, _, n in ops if phase != "step")


def seconds(ops: list, rates: Rates) -> dict:
    """One micro-batch's forward and backward and the optimizer step, timed at `rates`; which ops bound it."""
    out = {**{p: 0.0 for p in PHASES}, "compute_bound_s": 0.0, "memory_bound_s": 0.0, "ops": dict.fromkeys(PHASES, 0)}
    no_rate = set()
    for phase, key, flops, moved, n in ops:
        out["ops"][phase] += n
        key = rates.fp32_key if key == "fp32" else key
        rate = rates.flops.get(key) or (rates.flops.get("fp32") if key == "tf32" else None)
        if flops and not rate:
            no_rate.add(key)
        compute_s, memory_s = (flops / rate if flops and rate else 0.0), moved / rates.memory_bytes_s
        out[phase] += n * max(compute_s, memory_s)
        out["compute_bound_s" if compute_s > memory_s else "memory_bound_s"] += n * max(compute_s, memory_s)
    return {**out, "no_rate": sorted(no_rate)}


def rates_of(profile, compute_key: str) -> Optional[Rates]:
    """The profile's rates, or None where it has no memory bandwidth (a step cannot be timed). On a CPU
    profile without them, this machine's, measured once (measure/peak.py)."""
    flops = {k: v * 1e12 for k, v in profile.tflops.items()}
    memory, host, source = profile.memory_gbs, profile.host_link_gbs, "profile (datasheet)"
    if profile.device == "cpu" and (not flops or memory is None):
        from ..measure import peak

        measured = peak.cpu_rates()
        flops, memory, host = {**measured["flops"], **flops}, memory or measured["memory_gbs"], None
        source = f"this CPU, measured at start-up ({measured['threads']} threads)"
    if memory is None:
        return None
    return Rates(flops=flops, memory_bytes_s=memory * GB, host_bytes_s=host * GB if host else None,
                 fp32_key="tf32" if compute_key == "tf32" else "fp32", source=source)


def step_time(traced: dict, plan, profile) -> dict:
    """The predicted time of one optimizer step: accumulation x (forward + backward of a micro-batch) + the
    optimizer step + activation offload's host copies (save_on_cpu: each saved tensor to the host in forward
    and back in backward, over the host link), with its parts; `step_s` None with the reason where it cannot
    be predicted."""
    rates = rates_of(profile, plan.techniques.precision.compute)
    if rates is None:
        return {"step_s": None, "why_not": f"profile {profile.name} has no memory_gbs (memory bandwidth)"}
    parts = seconds(traced["roofline_ops"], rates)
    accumulation = plan.accumulation_steps
    offloaded = traced.get("offloaded_bytes_per_micro_batch", 0)
    if offloaded and rates.host_bytes_s is None:
        return {"step_s": None, "why_not": f"profile {profile.name} has no host_link_gbs for offload's copies"}
    host_s = accumulation * 2 * offloaded / rates.host_bytes_s if offloaded else 0.0
    total = accumulation * (parts["forward"] + parts["backward"]) + parts["step"] + host_s
    # how many ops the host dispatches one by one, and their mean time on the GPU: a few microseconds each,
    # and the host's dispatch of each op (not in this bound) paces the step instead
    ops = parts["ops"]["forward"] + parts["ops"]["backward"]
    out = {"step_s": total, "forward_s": parts["forward"], "backward_s": parts["backward"],
           "optimizer_s": parts["step"], "host_transfer_s": host_s, "accumulation_steps": accumulation,
           "ops_per_micro_batch": ops, "ops_in_optimizer_step": parts["ops"]["step"],
           "gpu_us_per_op": 1e6 * (parts["forward"] + parts["backward"]) / ops if ops else None,
           "compute_bound_share": parts["compute_bound_s"] / max(parts["compute_bound_s"] + parts["memory_bound_s"], 1e-30),
           "rates": rates.source, "method": "roofline per op (torch RuntimeEstimator), no efficiency factor"}
    if parts["no_rate"]:
        out.update(step_s=None, why_not=f"profile {profile.name} has no peak rate for {', '.join(parts['no_rate'])}")
    elif traced.get("optimizer_on_host"):  # the adjustment took the optimizer off the device (adjust.py)
        # the step on the host depends on the host's CPU and memory, which no profile describes; the GPU runs none
        out.update(step_s=total - parts["step"], optimizer_s=0.0,
                   note="the optimizer steps on the host: its step and the copies of gradients and weights to and "
                        "from it are not timed (a lower bound)")
    elif traced.get("optimizer") and traced.get("adjustment") and plan.techniques.deepspeed.on:
        out["note"] = "DeepSpeed's flat-partition optimizer step and its collectives are not timed"
    return out
