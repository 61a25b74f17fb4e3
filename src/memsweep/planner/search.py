"""The search: every combination of the space on every GPU, as a row that fits, does not fit, or is refused
by a rule (techniques/rules.py), with its reason. Micro-batches are tried smallest first; once one fits no
GPU, the larger ones are not traced (a larger micro-batch holds more activations and nothing less), and
their rows say so. One trace serves every GPU (estimate.core's memo: the trace reads only the device). Before
any trace, a combination whose weights, gradients and optimizer state (floor.py, the same at every micro-batch)
no GPU can hold is listed as not fitting on each, with the figures, and not traced. The combinations are
searched in units (space.units), in worker processes where there are several CPUs (parallel.py)."""
import dataclasses
import time
from collections.abc import Callable

from ..config.hardware import load_profile
from ..config.schema import Config, HardwareConf, OffloadConf
from ..errors import Unsupported
from ..techniques import rules
from . import depth, floor, parallel, space


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


def rows_of(combo: dict, m: int, job: Config, profiles, memo: dict, depths) -> tuple[list[dict], bool]:
    """The rows of one combination at micro-batch m on every GPU, and whether it fits any."""
    variant = space.variant(job, combo, m)
    base = {**combo, "micro_batch": m, "accumulation": variant.accumulation.steps,
            "changes": space.changes_to_training(combo)}
    refused = refusals(variant, profiles)
    allowed = [p for p in profiles if p.name not in refused]
    rows = [{**base, "gpu": g, "status": "refused", "reason": r} for g, r in refused.items()]
    # a trace serves every GPU: the floor saves one only where no GPU can hold it
    if allowed and (held := floor_of(combo, variant, allowed[0], memo)):
        too_large = {p.name: floor.too_large(held, p) for p in allowed}
        if all(too_large.values()):
            rows += [{**base, "gpu": g, "status": "does not fit", "method": "floor (no trace)", "reason": r}
                     for g, r in too_large.items()]
            allowed = []
    if not allowed:
        return rows, False
    try:
        made = depth.row_figures(variant, allowed, memo, depths)
    except Exception as exc:  # noqa: BLE001 - one combination the estimator cannot trace is a row, not a crash
        reason = f"not estimated: {type(exc).__name__}: {str(exc)[:200]}"
        return rows + [{**base, "gpu": p.name, "status": "error", "reason": reason} for p in allowed], True
    for p in allowed:
        figs = made["per_gpu"][p.name]
        status = "fits" if figs["fits"] else "does not fit"
        rows.append({**base, **figs, "gpu": p.name, "status": status, "method": made["method"],
                     "reason": figs["why_not"] or figs["time_note"] or ""})  # no time, or what its time leaves out
    return rows, any(r["status"] == "fits" for r in rows)


def floor_of(combo: dict, variant: Config, profile: HardwareConf, memo: dict) -> dict:
    """The combination's floor on the GPU (floor.py), made once per what it depends on; {} where it has none or
    it cannot be made (the trace then reports why)."""
    if floor.sharded(combo):
        return {}
    key = (*floor.key(combo), repr((variant.model, variant.task)), profile.device)
    if key not in memo:
        try:
            memo[key] = floor.held_bytes(dataclasses.replace(variant, offload=OffloadConf()), profile)  # all on it
        except Exception:  # noqa: BLE001 - no floor is no shortcut: the combination is traced as it is
            memo[key] = {}
    return floor.on_device(memo[key], combo)


def search(job: Config, progress: Callable[[str], None] | None = None, memo: dict | None = None) -> list[dict]:
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


def unit_rows(job: Config, unit: list[tuple[int, dict]], memo: dict, progress: Callable[[str], None]) -> list[dict]:
    """The rows of a unit's combinations (each numbered in the space), micro-batches smallest first."""
    profiles = [load_profile(name) for name in job.plan.hardware]
    sizes, depths, rows = space.micro_batches(job), list(job.plan.depths) or None, []
    for n, combo in unit:
        started = time.perf_counter()
        for i, m in enumerate(sizes):
            found, fits_any = rows_of(combo, m, job, profiles, memo, depths)
            rows += found
            if not fits_any and any(r["status"] != "refused" for r in found):
                rows += untraced(combo, sizes[i + 1:], m, job, found)
                break
        progress(f"{n}: {' '.join(f'{k}={v}' for k, v in combo.items())} ({time.perf_counter() - started:.1f} s)")
    return rows


def untraced(combo: dict, larger: list[int], m: int, job: Config, found: list[dict]) -> list[dict]:
    """The rows of the micro-batches after one that fit no GPU: they do not fit either (or are refused)."""
    out = []
    for row in found:
        for k in larger:
            status, reason = ("refused", row["reason"]) if row["status"] == "refused" else (
                "does not fit", f"not traced: micro-batch {m} already did not fit, and memory grows with it")
            if row.get("method") == "floor (no trace)":
                reason = row["reason"]
            out.append({**{x: row[x] for x in (*space.GROUPS, "changes", "gpu")},
                        "micro_batch": k, "accumulation": space.per_rank(job) // k, "status": status, "reason": reason,
                        "method": row["method"] if row.get("method") == "floor (no trace)" else ""})
    return out
