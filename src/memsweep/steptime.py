"""Wall time of each optimizer step, and the time from process start to the first step.

A step's time is the interval between the ends of two consecutive optimizer steps: everything the
step costs (loading its batches, forward, backward, clipping, optimizer, scheduler, callbacks).
Host clock only: no device synchronisation (on a GPU the intervals are the steady-state throughput
once the launch queue is full, not the latency of one step).
"""
import statistics
import time
from typing import Any, Optional

from transformers import TrainerCallback


def process_start_unix() -> Optional[float]:
    """When this process started (seconds since the epoch), or None where psutil cannot say."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - start-up time is informative, never worth failing a job
        return None


def step_summary(step_ends: list[float], skip: set[int], warmup: int = 1) -> dict[str, Any]:
    """Median and count of step durations, steps numbered from 1.

    Step k (k >= 2) lasts step_ends[k-1] - step_ends[k-2]. The first `warmup` steps and the steps in
    `skip` (e.g. the memory-ledger step, which is padded and traced) are left out.
    """
    durations = [step_ends[k - 1] - step_ends[k - 2] for k in range(max(2, warmup + 1), len(step_ends) + 1)
                 if k not in skip]
    return {"step_s_median": round(statistics.median(durations), 5) if durations else None,
            "steps_timed": len(durations)}


class StepTimer(TrainerCallback):
    def __init__(self, skip_steps: tuple[int, ...] = (), warmup: int = 1):
        self.skip = set(skip_steps)
        self.warmup = warmup
        self.first_step_unix: Optional[float] = None
        self.first_step_perf: Optional[float] = None
        self.step_ends: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first_step_perf is None:
            self.first_step_perf, self.first_step_unix = time.perf_counter(), time.time()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append(time.perf_counter())

    def summary(self, setup_started: float) -> dict[str, Any]:
        """`setup_started`: perf_counter() when the job began building (tokenizer, data, model)."""
        out = step_summary(self.step_ends, self.skip, self.warmup)
        out["setup_s"] = round(self.first_step_perf - setup_started, 3) if self.first_step_perf else None
        started = process_start_unix()
        out["startup_s"] = round(self.first_step_unix - started, 3) if self.first_step_unix and started else None
        return out
