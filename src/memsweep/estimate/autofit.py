"""`autofit=true`: before training, the largest micro-batch whose estimate fits the hardware profile's
capacity less `autofit_headroom`, with the accumulation steps that keep `batch_size`."""
import dataclasses
from typing import Any

from ..config.schema import Config, HardwareConf
from ..errors import Unsupported
from ..run.setup import build_setup
from .core import GIB, capacity_bytes, estimate_job


def autofit_budget(profile: HardwareConf, headroom: float) -> int | None:
    """What autofit lets a job's estimated total reach: the profile's capacity less `headroom` (a fraction)."""
    capacity = capacity_bytes(profile)
    return None if capacity is None else int(capacity * (1 - headroom))


def autofit(job: Config, profile: HardwareConf, headroom: float = 0.0) -> tuple[int, int]:
    """The largest micro-batch whose estimated total fits the profile's capacity (less `headroom`, a
    fraction of it), with the accumulation steps that keep the effective batch_size.

    Micro-batches divide batch_size / ranks (nodes x nproc). Without accumulation no gradients are alive during the
    forward; with it they are (from the previous micro-batch), so the whole batch is tried first and
    the smaller micro-batches, whose memory grows with their size, by bisection.
    """
    capacity, budget = capacity_bytes(profile), autofit_budget(profile, headroom)
    setup = build_setup(job, profile)
    per_process = setup.batch_size // setup.world_size
    if budget is None:
        return per_process, 1

    def fits(micro: int) -> bool:
        steps = per_process // micro
        trial = dataclasses.replace(job, accumulation=dataclasses.replace(job.accumulation, steps=steps,
                                                                          name=f"x{steps}"))
        return estimate_job(trial, profile).total_bytes <= budget

    if fits(per_process):
        return per_process, 1
    candidates = [m for m in range(1, per_process) if per_process % m == 0]
    if not candidates or not fits(candidates[0]):
        raise Unsupported(f"autofit: even micro-batch 1 does not fit {profile.name} "
                          f"({capacity / GIB:.2f} GiB, headroom {headroom:.0%})")
    lo, hi = 0, len(candidates) - 1
    while lo < hi:  # candidates[lo] fits
        mid = (lo + hi + 1) // 2
        if fits(candidates[mid]):
            lo = mid
        else:
            hi = mid - 1
    return candidates[lo], per_process // candidates[lo]


def autofit_job(job: Config, profile: HardwareConf) -> tuple[Config, dict[str, Any]]:
    """`autofit=true`: the job with the micro-batch autofit chose, and the record of the choice."""
    micro, steps = autofit(job, profile, headroom=job.autofit_headroom)
    fitted = dataclasses.replace(job, accumulation=dataclasses.replace(job.accumulation, name=f"autofit_x{steps}",
                                                                       steps=steps))
    return fitted, {"micro_batch_size": micro, "accumulation_steps": steps, "batch_size": job.batch_size,
                    "requested_accumulation_steps": job.accumulation.steps, "headroom": job.autofit_headroom,
                    "budget_bytes": autofit_budget(profile, job.autofit_headroom)}
