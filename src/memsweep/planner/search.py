"""The search: every combination of the space on every GPU, at each micro-batch, as a `PlanRow` that fits,
does not fit, or is refused by a rule (techniques/rules.py), with its reason. Shortcuts (a floor before any
trace, micro-batches smallest first, one trace for every GPU) and the worker processes: docs/planner.md."""
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Literal

from ..config import validate
from ..config.hardware import load_profile
from ..config.schema import Config, HardwareConf, OffloadConf
from ..errors import ConfigError, Unsupported
from ..techniques import rules
from . import depth, floor, parallel, space
from .depth import Figures
from .space import Combination

Status = Literal["fits", "does not fit", "error", "refused"]
# the method of a row the floor (floor.py) shows too large for every GPU, without a trace
FLOOR = "floor (no trace)"


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One row of the plan (plan.csv): a combination at a micro-batch on one GPU."""
    combination: Combination
    micro_batch: int
    accumulation: int  # the micro-batches of each process's share of batch_size
    gpu: str  # the hardware profile's name
    status: Status
    reason: str = ""  # the rule's, the floor's, the error, or what its time leaves out
    method: str = ""  # how the memory was traced ("" where it was not)
    figures: Figures | None = None  # None where nothing was traced: refused, the floor's, an error, untraced
    rank: int | None = None  # among the GPU's fitting rows, fastest first (table.ranked)


def refusals(job: Config, profiles: list[HardwareConf]) -> dict[str, str]:
    """{profile name: the rule's reason} for the profiles a rule refuses this job on (no-gpu aside: a plan,
    like an estimate, needs no GPU)."""
    out = {}
    for p in profiles:
        try:
            rules.refuse_unsupported(job, p, skip=("no-gpu",))
        except Unsupported as exc:
            out[p.name] = str(exc)
    return out


def rows_of(combo: Combination, m: int, job: Config, profiles, memo: dict, depths) -> list[PlanRow]:
    """The rows of one combination at micro-batch m on every GPU."""
    variant = space.variant(job, combo, m)
    row = functools.partial(PlanRow, combination=combo, micro_batch=m, accumulation=variant.accumulation.steps)
    try:
        validate.ranges(variant)  # the row as a job: what the command line would refuse, it refuses before a trace
    except ConfigError as exc:
        return [row(gpu=p.name, status="refused", reason=f"bad input: {exc}") for p in profiles]
    refused = refusals(variant, profiles)
    allowed = [p for p in profiles if p.name not in refused]
    rows = [row(gpu=g, status="refused", reason=r) for g, r in refused.items()]
    # a trace serves every GPU: the floor saves one only where no GPU can hold it
    if allowed and (held := floor_of(combo, variant, allowed[0], memo)):
        too_large = {p.name: floor.too_large(held, p) for p in allowed}
        if all(too_large.values()):
            return rows + [row(gpu=g, status="does not fit", method=FLOOR, reason=r) for g, r in too_large.items()]
    if not allowed:
        return rows
    try:
        made = depth.row_figures(variant, allowed, memo, depths)
    except Exception as exc:  # noqa: BLE001 - one combination the estimator cannot trace is a row, not a crash
        reason = f"not estimated: {type(exc).__name__}: {str(exc)[:200]}"
        return rows + [row(gpu=p.name, status="error", reason=reason) for p in allowed]
    for p in allowed:
        figures = made.per_gpu[p.name]
        rows.append(row(gpu=p.name, status="fits" if figures.fits else "does not fit", method=made.method,
                        reason=figures.why_not or figures.time_note or "",  # no time, or what its time leaves out
                        figures=figures))
    return rows


def floor_of(combo: Combination, variant: Config, profile: HardwareConf, memo: dict) -> floor.Floor | None:
    """The combination's floor on the GPU (floor.py), made once per what it depends on; None where it has none
    or it cannot be made (the trace then reports why)."""
    if floor.sharded(combo.placement):
        return None
    key = (*floor.key(combo), repr((variant.model, variant.task)), profile.device)
    if key not in memo:
        try:
            memo[key] = floor.held_bytes(dataclasses.replace(variant, offload=OffloadConf()), profile)  # all on it
        except Exception:  # noqa: BLE001 - no floor is no shortcut: the combination is traced as it is
            memo[key] = None
    return None if memo[key] is None else floor.on_device(memo[key], combo.placement)


def search(job: Config, progress: Callable[[str], None] | None = None, memo: dict | None = None) -> list[PlanRow]:
    """Every row of the plan, unit by unit. Units (space.units) are searched in worker processes
    (parallel.py); a caller that keeps `memo` (a dict: the traces and floors made) has them searched here."""
    units, progress = space.units(job), progress or (lambda line: None)
    processes = 1 if memo is not None else parallel.workers(job.plan.workers, len(units))
    if processes > 1:
        found = parallel.map_units(unit_rows, job, units, processes, progress)
    else:
        memo = {} if memo is None else memo
        found = [unit_rows(job, unit, memo, progress) for unit in units]
    return [row for rows in found for row in rows]


def unit_rows(job: Config, unit: list[tuple[int, Combination]], memo: dict,
              progress: Callable[[str], None]) -> list[PlanRow]:
    """The rows of a unit's combinations (each numbered in the space), micro-batches smallest first."""
    profiles = [load_profile(name) for name in space.profiles(job)]
    sizes, depths, rows = space.micro_batches(job), list(job.plan.depths) or None, []
    for n, combo in unit:
        started = time.perf_counter()
        for i, m in enumerate(sizes):
            found = rows_of(combo, m, job, profiles, memo, depths)
            rows += found
            if outgrown(found):
                rows += untraced(sizes[i + 1:], m, job, found)
                break
        said = " ".join(f"{g}={o}" for g, o in combo.options().items())
        progress(f"{n}: {said} ({time.perf_counter() - started:.1f} s)")
    return rows


def outgrown(found: list[PlanRow]) -> bool:
    """Whether a micro-batch's rows leave the larger micro-batches nothing to trace: a GPU was tried (not every
    one refuses it), none fits it and it had no error (a larger micro-batch holds more, and nothing less)."""
    tried = [row for row in found if row.status != "refused"]
    return bool(tried) and not any(row.status in ("fits", "error") for row in tried)


def untraced(larger: list[int], m: int, job: Config, found: list[PlanRow]) -> list[PlanRow]:
    """The rows of the micro-batches after one that fit no GPU: they do not fit either (or are refused)."""
    grown = f"not traced: micro-batch {m} already did not fit, and memory grows with it"
    out = []
    for row in found:
        same = row.status == "refused" or row.method == FLOOR  # the rule's or the floor's at every micro-batch
        for k in larger:
            out.append(PlanRow(combination=row.combination, micro_batch=k, accumulation=space.per_rank(job) // k,
                               gpu=row.gpu, status="refused" if row.status == "refused" else "does not fit",
                               reason=row.reason if same else grown, method=FLOOR if row.method == FLOOR else ""))
    return out
