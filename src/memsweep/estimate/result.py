"""An estimate, typed: what the estimator predicts for one job on one hardware profile (as run/results.py's
Result is what a job measured). Written as estimate.json and stored as results.json's `estimate`."""
from dataclasses import asdict, dataclass, field
from typing import Any

from .step_time import StepTime

GPU_COUNTERS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes", "reserved_upper_bytes",
                "device_used_upper_bytes", "over_run")


@dataclass
class RunReserved:
    """What the caching allocator reserves over a run whose steps differ in length (run_replay.py), beside one
    step at max_seq_len, with the default allocator and with expandable segments."""
    steps: int  # the run's optimizer steps it covers (run_replay.replay_run skips those it shows change nothing)
    lengths: str  # where their lengths come from: "data" (the job's examples, in its sampler's order) or "spread"
    shortest: int  # padded tokens of the shortest and the longest micro-batch replayed
    longest: int
    one_step_reserved_bytes: int  # one step at max_seq_len (the default allocator)
    reserved_bytes: int  # max_memory_reserved over the run (the default allocator); never below one step
    one_step_expandable_bytes: int  # the same under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    reserved_expandable_bytes: int
    expandable_segments: bool  # which of the two the job runs with (the expandable_segments key)
    seconds: float = 0.0

    @property
    def job_reserved_bytes(self) -> int:
        """The run's reserved bytes under the allocator the job runs with."""
        return self.reserved_expandable_bytes if self.expandable_segments else self.reserved_bytes

    @property
    def fragmentation_bytes(self) -> int:
        """What the run reserves beyond one step at max_seq_len (the default allocator)."""
        return self.reserved_bytes - self.one_step_reserved_bytes


@dataclass
class Estimate:
    method: str  # "trace", or "adjusted trace": the nearest traceable job with named arithmetic (adjust.py)
    method_reason: str | None  # what the adjustment stands for
    hardware: str
    device: str  # "cpu" or "cuda"
    micro_batch_size: int
    accumulation_steps: int
    seq_len: int
    peak_bytes: int  # tensor bytes at the peak, as results.json memory.peak_bytes
    overhead_bytes: int  # the profile's CUDA context
    total_bytes: int  # what must fit the capacity: device used (its upper figure) on a GPU, the peak on a CPU
    breakdown: dict[str, int]  # the peak by part, and the overhead
    activations_bytes: int  # held for backward when backward starts
    grads_bytes: int
    optimizer_bytes: int
    capacity_bytes: int | None
    fits: bool | None
    margin_bytes: int | None
    flops_per_step: int
    flops_source: str
    compute_dtype: str  # the profile's `tflops` key the step is timed at
    peak_tflops: float | None
    step_time_s: float | None  # FLOPs at the profile's peak matmul rate: a lower bound on a step's time
    predicted_step_s: float | None  # the roofline per op (roofline.py); None with step_time.why_not
    tokens_per_s: float | None  # tokens of one optimizer step (padded to seq_len) / predicted_step_s
    step_time: StepTime  # the roofline's parts: forward, backward, optimizer, host transfers, rates
    trace: dict[str, Any]  # the trace's own reading (and the allocator model's on a GPU)
    total_params: int
    trainable_params: int
    architecture_source: str
    notes: list[str] = field(default_factory=list)
    # each rank's peak and breakdown where ranks differ (DeepSpeed ZeRO-2: zero.py); the job's figures are rank 0's
    per_rank: list[dict[str, Any]] | None = None
    shape_advice: dict[str, Any] | None = None
    seconds: float = 0.0
    # A GPU's three counters, each predicted as that counter is made (core.device_counters)
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_used_bytes: int | None = None
    # The safe side of packing (capture.packing_envelope): what total_bytes, fits and the margin use on a GPU
    reserved_upper_bytes: int | None = None
    device_used_upper_bytes: int | None = None
    # A GPU job whose steps differ in length: reserved over its run (run_replay.py); total_bytes and fits use it
    over_run: RunReserved | None = None

    def to_dict(self) -> dict[str, Any]:
        """estimate.json: every field; a GPU's counters only on a GPU profile."""
        out = {**asdict(self), "step_time": self.step_time.to_dict()}
        if self.device != "cuda":
            for key in GPU_COUNTERS:
                out.pop(key)
        return out
