"""The trace, typed: what trace.trace reads off one traced training step (its ledger, its ops, its recorded
allocations and, on a GPU, the allocator model's reading), kept in core.estimate_job's memo, derived by the
planner (planner/batch.py, twin.py) and timed by the roofline (roofline.py). Every field is named as the
trace's reading calls it in estimate.json's `trace` (to_dict: the same keys in the same order).

Module level and plain, so a memo of traces pickles to the planner's worker processes (planner/parallel.py).
"""
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ..techniques.quantize import Audit
from .capture import AllocatorReading, PagedIn
from .events import Event
from .op_record import CountedOp, OpCost
from .products import CountedProduct
from .scratch import Gpu, Reduction


@dataclass
class RankReading:
    """One rank's reading where ranks differ (DeepSpeed ZeRO-2: each its own partition; trace.adjusted_reading)."""
    rank: int
    peak_bytes: int
    breakdown: dict[str, int]
    allocator: AllocatorReading | None = None  # on a GPU profile

    def to_dict(self) -> dict[str, Any]:
        """As estimate.json writes it: the allocator's reading only on a GPU profile."""
        out = {"rank": self.rank, "peak_bytes": self.peak_bytes, "breakdown": self.breakdown}
        if self.allocator is not None:
            out["allocator"] = self.allocator.to_dict()
        return out


@dataclass(kw_only=True)
class Trace:
    """One traced step. Fields that only some traces hold are None where a trace lacks them (an adjustment's,
    a GPU's); those with a plain default read as absent where the trace has none (no ops recorded, no copies)."""
    # the ledger's reading (measure/ledger.ledger_reading; for an adjusted job capture.tensor_reading of its events)
    peak_bytes: int
    breakdown: dict[str, int]  # at the peak, sums to peak_bytes
    activations_bytes: int  # held for backward when backward starts
    grads_bytes: int
    optimizer_bytes: int
    # the warm-up step's ops (op_record.py, products.py)
    flops_per_step: int
    roofline_ops: list[CountedOp]
    roofline_sequence: list[OpCost] = field(default_factory=list)  # one per op run, in order
    roofline_products: list[CountedProduct] = field(default_factory=list)
    recomputed_ops: int = 0  # backward's ops that recompute the forward (activation checkpointing)
    modules: int = 0  # what Trainer walks each micro-batch
    paged_in_bytes: PagedIn = field(default_factory=PagedIn)  # per phase (capture.paged_in)
    optimizer: str  # the optimizer's class name
    recorded_peak_bytes: int  # the recorded events read as the ledger reads a step (a check)
    # bitsandbytes' paged optimizer state on a GPU (paged.off_allocator): outside the ledger, the events and
    # the allocator's counters; on the device beside them (core.device_counters adds it to device used)
    paged_state_bytes: int = 0
    # an adjusted trace's (adjust.py): what the adjustment stands for, and its arithmetic's readings
    adjustment: str | None = None
    optimizer_on_host: bool | None = None
    allocator: AllocatorReading | None = None  # on a GPU profile: the reading for `gpu` and `workspace`
    per_rank: list[RankReading] | None = None  # a job of several processes: each rank's
    offloaded_bytes_per_micro_batch: int = 0  # save_on_cpu's copies to the host (none: 0, left out of to_dict)
    seconds: float = 0.0  # the trace's own time
    twin: str | None = None  # the precision whose trace this is, relabelled (planner/twin.py)
    # kept for the planner and for other GPUs, not written to estimate.json (core.BULKY)
    events: list[Event] | None = None  # the recorded step (capture.Recorder), kept on a GPU profile
    categories: dict[Hashable, str] | None = None  # block key -> category
    reductions: dict[Hashable, Reduction] = field(default_factory=dict)  # staging block key -> its reduction
    cublas_keys: list[str] | None = None  # the cuBLAS workspaces' keys among the events
    gpu: Gpu | None = None  # the GPU the allocator reading is for (scratch.gpu_of: None off CUDA)
    workspace: int | None = None  # the cuBLAS workspace bytes the allocator reading is for
    # (gpu, workspace) -> the allocator reading there: each GPU's read once (trace.for_gpu)
    readings: dict[tuple[Gpu | None, int], AllocatorReading] = field(default_factory=dict)
    total_params: int = 0
    trainable_params: int = 0
    derived_from: tuple[int, ...] = ()  # the micro-batches whose traces this one lies between (planner/batch.py)
    quantization: Audit | None = None  # the traced model's quantized base (lora.quantize), as a real job's effective

    def for_any_gpu(self) -> "Trace":
        """The trace without what it holds for one GPU only (trace.for_gpu makes those per GPU): any GPU's."""
        return replace(self, allocator=None, gpu=None, workspace=None, readings={})

    def to_dict(self, left_out: tuple[str, ...] = ()) -> dict[str, Any]:
        """The trace as a dict (estimate.json's `trace`, less `left_out`): every field it holds, in field order;
        a field it lacks (None, or no offloaded bytes) left out."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in left_out or value is None or (f.name == "offloaded_bytes_per_micro_batch" and not value):
                continue
            if isinstance(value, AllocatorReading):
                value = value.to_dict()
            elif f.name == "per_rank":
                value = [r.to_dict() for r in value]
            elif isinstance(value, PagedIn | Audit):
                value = asdict(value)
            out[f.name] = value
        return out
