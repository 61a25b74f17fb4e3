"""estimate.md, the table of a sweep's estimates (through pandas, from the jobs sweepdir.py collects), and
estimate-by-<key>.md with one column group per value of a key (e.g. one per GPU)."""
from pathlib import Path
from typing import Any

import pandas as pd

from ..estimate.table import GIB, estimate_row
from ..measure import shapes
from . import sweepdir

SWEEP_TABLE = "estimate.md"


def _estimated(job: sweepdir.SweepJob) -> dict[str, Any] | None:
    return job.estimate if job.estimate and job.estimate.get("method") else None


def sweep_table(jobs: list[sweepdir.SweepJob]) -> str:
    """Markdown table of a sweep's estimates, one row per job; a job without an estimate shows why."""
    keys, _ = sweepdir.varying(jobs)
    if len(jobs) == 1:  # nothing varies: show what the one job set
        keys = list(sweepdir.as_dict(jobs[0].overrides))
    advices = [est.get("shape_advice") for est in map(_estimated, jobs) if est is not None]
    rows = []
    for job in jobs:
        row = {"#": str(job.num), **{k: sweepdir.as_dict(job.overrides).get(k, "") for k in keys}}
        est = _estimated(job)
        if est is not None:
            row.update(estimate_row(est, with_shapes=any(advices)))
        else:
            why = (job.estimate or {}).get("error") or (job.reason if job.status != "ok" else None)
            row["method"] = " ".join(f"{job.status}: {why}".split()) if why else job.status
        rows.append(row)
    table = pd.DataFrame(rows).fillna("").to_markdown(index=False, disable_numparse=True)
    notes = sorted({f"{est['method']}: {est['method_reason']}" for est in map(_estimated, jobs)
                    if est is not None and est["method_reason"]}) + shapes.table_notes(advices)
    if any(est is not None and est["device"] == "cuda" for est in map(_estimated, jobs)):
        notes.insert(0, "total = what must fit the capacity: on a GPU the device used (nvidia-smi: reserved + the "
                        "CUDA context) with reserved on the safe side of packing (reserved upper: the most the step "
                        "reserves with its activations scaled down), on a CPU the peak. allocated / reserved = "
                        "torch.cuda.max_memory_allocated / max_memory_reserved as replayed.")
    return "\n".join([table, ""] + [f"- {note}" for note in notes]) + "\n"


def write_sweep_table(sweep_dir: Path) -> Path:
    """estimate.md of a sweep dir, from its jobs' estimate.json (or results.json with an estimate)."""
    path = Path(sweep_dir) / SWEEP_TABLE
    path.write_text(f"# Estimates: {sweep_dir}\n\n" + sweep_table(sweepdir.collect(sweep_dir)))
    return path


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.{1 if seconds < 0.1 else 0}f}"


def pivot_table(jobs: list[sweepdir.SweepJob], by: str) -> str:
    """One row per combination of the keys that vary besides `by`, and for each value of `by` (e.g. each
    GPU) its fit, margin, predicted total (device used on a GPU) and step time; why a cell has no
    estimate is a numbered note under the table."""
    keys = [k for k in sweepdir.varying(jobs)[0] if k != by]
    columns = list(dict.fromkeys(sweepdir.as_dict(j.overrides).get(by, "") for j in jobs))
    rows: dict[tuple, dict[str, str]] = {}
    reasons: dict[str, int] = {}
    for job in jobs:
        values = sweepdir.as_dict(job.overrides)
        row = rows.setdefault(tuple(values.get(k, "") for k in keys),
                              {**{k: values.get(k, "") for k in keys}, "method": ""})
        col, est = values.get(by, ""), _estimated(job)
        if est is None:
            why = " ".join(str((job.estimate or {}).get("error") or job.reason or job.status).split())
            note = reasons.setdefault(f"{job.status}: {why}", len(reasons) + 1)
            row.update({f"{col} fits": f"{job.status} [{note}]", f"{col} margin GiB": "-", f"{col} used GiB": "-",
                        f"{col} ms/step": "-"})
            continue
        method = est["method"].replace("_", " ")
        row["method"] = method if row["method"] in ("", method) else f"{row['method']}, {method}"
        row.update({f"{col} fits": {True: "yes", False: "**no**", None: "?"}[est["fits"]],
                    f"{col} margin GiB": "-" if est["margin_bytes"] is None else f"{est['margin_bytes'] / GIB:+.1f}",
                    f"{col} used GiB": f"{est['total_bytes'] / GIB:.1f}",
                    f"{col} ms/step": _ms(est["step_time_s"])})
    for row in rows.values():
        row["method"] = row["method"] or "-"
    order = keys + ["method"] + [f"{c} {part}" for c in columns
                                 for part in ("fits", "margin GiB", "used GiB", "ms/step")]
    frame = pd.DataFrame(list(rows.values())).reindex(columns=order).fillna("-")
    common = sweepdir.varying(jobs)[1]
    notes = [f"every row: {' '.join(common)}" if common else "",
             "used GiB = the predicted total that must fit: on a GPU nvidia-smi's used (peak reserved on the safe "
             "side of packing + the CUDA context); margin = capacity - used; ms/step = FLOPs of a step at the "
             "GPU's peak dense rate, a lower bound",
             *(f"[{n}] {why}" for why, n in reasons.items())]
    return "\n".join([frame.to_markdown(index=False, disable_numparse=True), ""]
                     + [f"- {note}" for note in notes if note]) + "\n"


def write_pivot_table(sweep_dir: Path, by: str) -> Path:
    """estimate-by-<by>.md of a sweep dir: its estimates with one column group per value of `by`."""
    path = Path(sweep_dir) / f"estimate-by-{by.replace('/', '_')}.md"
    path.write_text(f"# Estimates by {by}: {sweep_dir}\n\n" + pivot_table(sweepdir.collect(sweep_dir), by))
    return path
