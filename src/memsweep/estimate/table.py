"""An estimate as people read it: the one line a job prints, and estimate.md, the table of a sweep's
estimates (through pandas, from the jobs sweepdir.py collects)."""
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from ..measure import shapes
from ..sweep import sweepdir

GIB = 2**30
SWEEP_TABLE = "estimate.md"


def _gib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def shape(est: dict[str, Any]) -> str:
    """The shape an estimate answers for: micro-batch x sequence length (and the accumulation steps)."""
    steps = est.get("accumulation_steps") or 1
    return (f"micro-batch {est.get('micro_batch_size')} x {est.get('seq_len')} tokens"
            + (f" x {steps} accumulation steps" if steps > 1 else ""))


def summary_line(est: dict[str, Any]) -> str:
    fits = {True: "fits", False: "DOES NOT FIT", None: "capacity unknown"}[est["fits"]]
    time_s = _predicted_time(est)
    # on a GPU the total takes reserved on the safe side of packing: both figures shown
    packing = (f" (reserved {_gib(est['peak_reserved_bytes'])} GiB, upper {_gib(est['reserved_upper_bytes'])} GiB)"
               if est.get("reserved_upper_bytes") is not None else "")
    return "\n".join([f"[memsweep] estimate ({est['method']}) on {est['hardware']} for {shape(est)}: "
                      f"{_gib(est['total_bytes'])} GiB{packing} of {_gib(est['capacity_bytes'])} GiB, {fits}; "
                      f"{est['flops_per_step'] / 1e12:.2f} TFLOP/step, {time_s}", *shapes.lines(est.get("shape_advice"))])


def _predicted_time(est: dict[str, Any]) -> str:
    """The predicted step time and what paces it (roofline.py), else FLOPs at the peak rate."""
    if est.get("predicted_step_s"):
        bound = (est.get("step_time") or {}).get("bound")
        return f"{est['predicted_step_s'] * 1e3:.1f} ms/step predicted" + (f" ({bound})" if bound else "")
    return "-" if est["step_time_s"] is None else f"{est['step_time_s'] * 1e3:.1f} ms/step at peak"


TABLE_PARTS = ("params", "grads", "optimizer", "activations", "temp", "overhead")


def _row(est: dict[str, Any], with_shapes: bool) -> dict[str, str]:
    bd = est["breakdown"]
    parts = {**bd, "temp": bd.get("temp", 0) + bd.get("buffers", 0) + bd.get("other", 0)}
    row = {"method": est["method"], "total GiB": _gib(est["total_bytes"]),
           **({"allocated GiB": _gib(est["peak_allocated_bytes"]), "reserved GiB": _gib(est["peak_reserved_bytes"]),
               "reserved upper GiB": _gib(est.get("reserved_upper_bytes")),
               "used GiB": _gib(est["device_used_bytes"])} if est["device"] == "cuda" else {}),
           **{p: _gib(parts.get(p, 0)) for p in TABLE_PARTS},
           "capacity GiB": _gib(est["capacity_bytes"]), "fits": {True: "yes", False: "**no**", None: "?"}[est["fits"]],
           "margin GiB": _gib(est["margin_bytes"]),
           "TFLOP/step": f"{est['flops_per_step'] / 1e12:.2f}",
           "ms/step predicted": "-" if not est.get("predicted_step_s") else f"{est['predicted_step_s'] * 1e3:.1f}",
           "ms/step at peak": "-" if est["step_time_s"] is None else f"{est['step_time_s'] * 1e3:.1f}"}
    if with_shapes:
        row["not a tensor-core multiple"] = shapes.cell(est.get("shape_advice"))
    return row


def _estimated(job: sweepdir.SweepJob) -> Optional[dict[str, Any]]:
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
            row.update(_row(est, with_shapes=any(advices)))
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


def _ms(seconds: Optional[float]) -> str:
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
    order = keys + ["method"] + [f"{c} {part}" for c in columns for part in ("fits", "margin GiB", "used GiB", "ms/step")]
    frame = pd.DataFrame(list(rows.values())).reindex(columns=order).fillna("-")
    common = sweepdir.varying(jobs)[1]
    notes = [f"every row: {' '.join(common)}" if common else "",
             "used GiB = the predicted total that must fit: on a GPU nvidia-smi's used (peak reserved on the safe "
             "side of packing + the CUDA context); margin = capacity - used; ms/step = FLOPs of a step at the GPU's peak dense rate, a lower "
             "bound",
             *(f"[{n}] {why}" for why, n in reasons.items())]
    return "\n".join([frame.to_markdown(index=False, disable_numparse=True), ""]
                     + [f"- {note}" for note in notes if note]) + "\n"


def write_pivot_table(sweep_dir: Path, by: str) -> Path:
    """estimate-by-<by>.md of a sweep dir: its estimates with one column group per value of `by`."""
    path = Path(sweep_dir) / f"estimate-by-{by.replace('/', '_')}.md"
    path.write_text(f"# Estimates by {by}: {sweep_dir}\n\n" + pivot_table(sweepdir.collect(sweep_dir), by))
    return path
