"""Wall time and minor page faults of each optimizer step, and the time from process start to the first step.

A step's time is the interval between the ends of two consecutive optimizer steps: everything the
step costs (loading its batches, forward, backward, clipping, optimizer, scheduler, callbacks).
Host clock only: no device synchronisation (on a GPU the intervals are the steady-state throughput
once the launch queue is full, not the latency of one step).
"""
import resource
import statistics
import time
from typing import Any

from transformers import TrainerCallback


def process_start_unix() -> float | None:
    """When this process started (seconds since the epoch), or None where psutil cannot say."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - start-up time is informative, never worth failing a job
        return None


WARMUP_STEPS = 1  # the first optimizer steps, left out of the timing: they make the kernels' and allocator's state


def _per_step(ends: list, skip: set[int], warmup: int) -> list:
    """Step k (k >= 2) is ends[k-1] - ends[k-2]; the first `warmup` steps and the steps in `skip` are left out."""
    return [ends[k - 1] - ends[k - 2] for k in range(max(2, warmup + 1), len(ends) + 1) if k not in skip]


def step_summary(step_ends: list[float], skip: set[int], warmup: int = WARMUP_STEPS,
                 faults: list[int] | None = None) -> dict[str, Any]:
    """Median and count of step durations, steps numbered from 1, and (given the process's minor page
    fault count at each step end) the mean faults per step: they come in bursts, so a median hides them.

    The first `warmup` steps and the steps in `skip` (e.g. the memory-ledger step, which is padded
    and traced) are left out.
    """
    durations = _per_step(step_ends, skip, warmup)
    out = {"step_s_median": round(statistics.median(durations), 5) if durations else None,
           "steps_timed": len(durations)}
    if faults is not None:
        counts = _per_step(faults, skip, warmup)
        out["minor_faults_per_step"] = round(statistics.mean(counts)) if counts else None
    return out


class StepTimer(TrainerCallback):
    def __init__(self, skip_steps: tuple[int, ...] = (), warmup: int = WARMUP_STEPS):
        self.skip = set(skip_steps)
        self.warmup = warmup
        self.first_step_unix: float | None = None
        self.first_step_perf: float | None = None
        self.step_ends: list[float] = []
        # Pages the process faulted in so far: host memory mapped anew each step shows here (host_memory.py).
        self.faults: list[int] = []

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first_step_perf is None:
            self.first_step_perf, self.first_step_unix = time.perf_counter(), time.time()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append(time.perf_counter())
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)

    def summary(self, setup_started: float) -> dict[str, Any]:
        """`setup_started`: perf_counter() when the job began building (tokenizer, data, model)."""
        out = step_summary(self.step_ends, self.skip, self.warmup, self.faults)
        out["setup_s"] = round(self.first_step_perf - setup_started, 3) if self.first_step_perf else None
        started = process_start_unix()
        out["startup_s"] = round(self.first_step_unix - started, 3) if self.first_step_unix and started else None
        return out
