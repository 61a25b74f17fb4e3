"""The sweep summary, built from the results.json files of a sweep dir (and nothing else).

Writes summary.csv (every results field, one row per job), summary.md (the human table), memory.png (what
holds each job's peak) and tradeoff.png (peak memory against train time) into the sweep dir; every job of
the grid gets a row, also one `not started` or `missing`. Runs at the end of every multirun (callbacks.py)
and at any time after: `python -m memsweep.sweep.report <sweep dir>` (`make report SWEEP=<sweep dir>`).

What each file holds: docs/guide/sweeps.md.
"""
import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from ..config.schema import is_on
from ..errors import STATUSES
from ..measure import shapes
from ..run import results
from . import plots, sweepdir
from .plots import GIB, PARTS
from .sweepdir import SweepError, SweepJob, as_dict

FILES = ("summary.csv", "summary.md", "memory.png", "tradeoff.png")
TRACEBACK_FILE = "traceback.txt"  # what a job that raised an error writes (app/job.py); bad input writes none
ReportError = SweepError  # bad input: not a sweep dir, or a baseline that names no job


@dataclass
class Summary:
    sweep_dir: Path
    jobs: list[SweepJob]
    baseline: SweepJob | None
    varying: list[str]  # override keys whose value differs between jobs
    common: list[str]  # overrides every job shares
    table: pd.DataFrame  # the human table, numbers unformatted (also the W&B table)
    markdown: str
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[SweepJob]:
        """Jobs that make a sweep unsuccessful: errors and jobs that left no result."""
        return [j for j in self.jobs if j.status in ("failed", "missing")]

    @property
    def unfinished(self) -> list[SweepJob]:
        """Jobs a stop ended or kept from starting: resume runs them."""
        return [j for j in self.jobs if j.status in ("interrupted", "not started")]


def failed_line(summary: Summary) -> str | None:
    """The line a sweep with failed or lost jobs ends with: which, where their reasons are (summary.md), and a
    traceback only where a job wrote one (a refused job's reason is its one line: bad input, exit 2)."""
    if not summary.failed:
        return None
    listed = ", ".join(f"{j.num} ({j.status})" for j in summary.failed)
    traces = [str(j.dir / TRACEBACK_FILE) for j in summary.failed if j.dir and (j.dir / TRACEBACK_FILE).is_file()]
    return (f"[memsweep] error: {len(summary.failed)} job(s) failed or left no result: {listed}; reasons in "
            f"{summary.sweep_dir / 'summary.md'}" + (f"; traceback: {', '.join(traces)}" if traces else ""))


# --- the baseline -----------------------------------------------------------------------------

def find_baseline(jobs: list[SweepJob], spec: str | None) -> SweepJob:
    """`report.baseline`: null = the first job; a job number; or overrides the job has ("precision=fp32",
    several separated by commas or spaces; the first job having them all)."""
    if spec is None or str(spec).strip() == "":
        return jobs[0]
    spec = str(spec).strip().strip("'\"")
    if spec.isdigit():
        for job in jobs:
            if job.num == int(spec):
                return job
        raise ReportError(f"baseline {spec}: there is no job {spec}; this sweep has jobs "
                          f"{jobs[0].num}..{jobs[-1].num}")
    wanted = as_dict(spec.replace(",", " ").split())
    if not wanted:
        raise ReportError(f"baseline {spec!r}: give a job number or overrides such as precision=fp32")
    for job in jobs:
        have = as_dict(job.overrides)
        if all(have.get(k) == v for k, v in wanted.items()):
            return job
    raise ReportError(f"baseline {spec}: no job has these overrides; the jobs are: "
                      + "; ".join(f"{j.num}: {' '.join(j.overrides) or 'default'}" for j in jobs))


# --- the tables -------------------------------------------------------------------------------

def human_table(jobs: list[SweepJob], baseline: SweepJob, varying: list[str]) -> pd.DataFrame:
    base_peak = baseline.get("memory.peak_bytes") if baseline.ok else None
    base_train = baseline.get("time.train_s") if baseline.ok else None
    rows = []
    for job in jobs:
        overrides = as_dict(job.overrides)
        row: dict[str, Any] = {"job": job.num}
        if varying:
            row.update({k: overrides.get(k, "") for k in varying})
        else:
            row["overrides"] = " ".join(job.overrides) or "default"
        peak = job.get("memory.peak_bytes") if job.ok else None
        train_s = job.get("time.train_s") if job.ok else None
        row.update(status=job.status, peak_gib=peak / GIB if peak else None)
        row.update({f"{p}_gib": v for p, v in plots.parts_gib(job).items()})
        predicted = results.estimate_vs_measured(job.res) if job.ok else {}
        predicted_peak = predicted.get("estimate_peak_bytes")
        row.update(predicted_gib=predicted_peak / GIB if predicted_peak else None,
                   predicted_error_pct=predicted.get("estimate_error_pct"), step_s=predicted.get("measured_step_s"),
                   predicted_step_s=predicted.get("predicted_step_s"),
                   step_error_pct=predicted.get("step_time_error_pct"))
        row["delta_memory_pct"] = 100 * (peak - base_peak) / base_peak if peak and base_peak else None
        row["speedup"] = base_train / train_s if train_s and base_train else None
        row.update(train_s=train_s, samples_per_s=job.get("time.samples_per_s") if job.ok else None,
                   f1=job.get("metrics.f1") if job.ok else None,
                   perplexity_before=job.get("metrics.perplexity_before") if job.ok else None,
                   perplexity=job.get("metrics.perplexity") if job.ok else None,
                   lr=job.get("effective.learning_rate") if job.ok else None,
                   lr_source=job.get("lr_source") if job.res else None, reason=job.reason)
        advice = job.get("shape_advice") if job.res else None
        row["tensor_core_shapes"] = shapes.cell(advice) if advice else None
        emulated = job.get("effective.emulated_precision") if job.res else None
        row["time_note"] = f"emulated {emulated}: time not representative" if emulated else None
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def _counts(jobs: list[SweepJob]) -> str:
    statuses = [j.status for j in jobs]
    return ", ".join(f"{statuses.count(s)} {s}" for s in (*STATUSES, "missing") if s in statuses)


def shown_columns(t: pd.DataFrame, baseline: SweepJob, varying: list[str], shapes_advised: bool) -> pd.DataFrame:
    """The summary table's columns as summary.md shows them: what varies, the status, memory and its
    breakdown, predicted vs measured, speed, quality, and the columns only some sweeps need."""
    shown = pd.DataFrame({"#": t["job"]})
    for key in varying or ["overrides"]:
        shown[key] = t[key]
    shown["status"] = t["status"]
    shown["peak GiB"] = [_fmt(v, ".3f") for v in t["peak_gib"]]
    for part in PARTS:
        shown[part] = [_fmt(v, ".3f") for v in t[f"{part}_gib"]]
    shown["predicted GiB"] = [_fmt(v, ".3f") for v in t["predicted_gib"]]
    shown["error"] = [_fmt(v, "+.1f", " %") for v in t["predicted_error_pct"]]
    shown["Δ memory"] = ["baseline" if n == baseline.num and baseline.ok else _fmt(v, "+.1f", " %")
                         for n, v in zip(t["job"], t["delta_memory_pct"])]
    shown["speed-up"] = [_fmt(v, ".2f", "×") for v in t["speedup"]]
    shown["train s"] = [_fmt(v, ".1f") for v in t["train_s"]]
    shown["samples/s"] = [_fmt(v, ".1f") for v in t["samples_per_s"]]
    shown["ms/step"] = [_fmt(1e3 * v if v else None, ".1f") for v in t["step_s"]]
    shown["predicted ms/step"] = [_fmt(1e3 * v if v else None, ".1f") for v in t["predicted_step_s"]]
    shown["time error"] = [_fmt(v, "+.1f", " %") for v in t["step_error_pct"]]
    # quality: macro-F1 for classification, perplexity for causal_lm (a sweep may hold both)
    if t["f1"].notna().any() or t["perplexity"].isna().all():
        shown["F1"] = [_fmt(v, ".3f") for v in t["f1"]]
    if t["perplexity_before"].notna().any():  # the pretrained model's, on the same eval split
        shown["perplexity before"] = [_fmt(v, ".2f") for v in t["perplexity_before"]]
    if t["perplexity"].notna().any():
        shown["perplexity"] = [_fmt(v, ".2f") for v in t["perplexity"]]
    if t["lr"].nunique() > 1:  # quality compares rows trained at different learning rates: say so
        shown["lr"] = [_fmt(v, ".3g") for v in t["lr"]]
    if shapes_advised:  # a GPU profile with a tensor-core rule
        shown["not a tensor-core multiple"] = [v or "–" for v in t["tensor_core_shapes"]]
    if t["time_note"].notna().any():  # a precision this machine only emulates: its speed says nothing
        shown["time"] = [v if isinstance(v, str) else "–" for v in t["time_note"]]
    return shown


def markdown(summary_table: pd.DataFrame, jobs: list[SweepJob], baseline: SweepJob, varying: list[str],
             common: list[str], notes: list[str]) -> str:
    advices = [j.get("shape_advice") if j.res else None for j in jobs]
    shown = shown_columns(summary_table, baseline, varying, any(advices))
    lines = [f"# Sweep summary: {len(jobs)} jobs ({_counts(jobs)})", ""]
    if common:
        lines += [f"Common to every job: `{' '.join(common)}`", ""]
    lines += [f"Baseline: job {baseline.num} (`{' '.join(baseline.overrides) or 'default'}`). "
              "Peak memory and its breakdown (GiB) are the measured ledger at the peak step: tensor bytes, "
              "the counter torch.cuda.max_memory_allocated is on a GPU; other = buffers + temporaries. "
              "Predicted = the estimator's peak on the same counter, made before the job ran (error vs the "
              "measured peak). On a GPU summary.csv also holds the reserved and nvidia-smi used figures, "
              "measured (memory.*) and predicted (estimate.*). ms/step is the measured median optimizer step "
              "(warm-up and ledger steps left out), predicted ms/step the estimate's, made before the job ran "
              "(time error vs measured). Δ memory and speed-up (train time) are against the baseline.", ""]
    lines += [shown.to_markdown(index=False, disable_numparse=True), ""]
    not_ok = [j for j in jobs if not j.ok]
    if not_ok:
        lines += ["Jobs that did not end `ok`:", ""]
        lines += [f"- job {j.num} (`{' '.join(j.overrides) or 'default'}`): **{j.status}** — {j.reason}"
                  for j in not_ok]
        lines.append("")
    lines += [f"- {n}" for n in notes + lr_notes(summary_table) + shapes.table_notes(advices)]
    return "\n".join(lines).rstrip() + "\n"


def lr_notes(t: pd.DataFrame) -> list[str]:
    """When the jobs trained at different learning rates, each one and where it came from."""
    ran = t[t["lr"].notna()]
    if ran["lr"].nunique() < 2:
        return []
    sources = [f"{lr:.3g} (jobs {', '.join(str(j) for j in group['job'])}): "
               + " / ".join(dict.fromkeys(str(x) for x in group["lr_source"] if x) or ["not recorded"])
               for lr, group in ran.groupby("lr", sort=True)]
    return ["the jobs used different learning rates (column lr), each from its stated source: " + "; ".join(sources)]


def flat_table(jobs: list[SweepJob], human: pd.DataFrame) -> pd.DataFrame:
    """summary.csv: every results field, flattened with dots; lists as JSON, overrides space-separated."""
    rows = []
    for job in jobs:
        flat = results.flatten(job.res) if job.res else {"status": job.status, "reason": job.reason}
        flat["overrides"] = " ".join(job.overrides)
        row = {"job": job.num, "job_dir": str(job.dir) if job.dir else None}
        row.update({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in flat.items()})
        rows.append(row)
    flat_df = pd.DataFrame(rows)
    comparison = human[["job", "delta_memory_pct", "speedup"]].rename(
        columns={"delta_memory_pct": "baseline.delta_memory_pct", "speedup": "baseline.speedup"})
    return flat_df.merge(comparison, on="job", how="left")


# --- all of it ----------------------------------------------------------------------------------

def build(sweep_dir: Path, baseline: str | None = None, strict: bool = True) -> Summary:
    """Read the sweep. A baseline that names no job raises ReportError, or, with strict=False (the end
    of a sweep, which must still get its summary), falls back to the first job with a note."""
    sweep_dir = Path(sweep_dir)
    jobs = sweepdir.collect(sweep_dir)
    notes = []
    try:
        base = find_baseline(jobs, baseline)
    except ReportError as exc:
        if strict:
            raise
        base = jobs[0]
        notes.append(f"{exc} — using job {base.num} instead")
    if not base.ok:
        notes.append(f"the baseline (job {base.num}) is {base.status}: no Δ memory or speed-up; "
                     f"choose another with report.baseline=<job number or overrides>")
    varying, common = sweepdir.varying(jobs)
    table = human_table(jobs, base, varying)
    return Summary(sweep_dir, jobs, base, varying, common, table,
                   markdown(table, jobs, base, varying, common, notes), notes)


def write(summary: Summary) -> dict[str, Path]:
    out = {name: summary.sweep_dir / name for name in FILES}
    flat_table(summary.jobs, summary.table).to_csv(out["summary.csv"], index=False)
    out["summary.md"].write_text(summary.markdown)
    plots.plot_memory(summary.jobs, summary.varying, out["memory.png"])
    plots.plot_tradeoff(summary.jobs, summary.baseline, summary.varying, out["tradeoff.png"])
    return out


def log_to_wandb(summary: Summary, logger_cfg, group: str) -> Path | None:
    """One job_type=summary run in the sweep's group: the table and both plots. Returns its run dir."""
    if not is_on(logger_cfg):
        return None
    import wandb

    from . import resume, wandb_log

    # A resumed (or re-reported) sweep keeps one summary run: an earlier one goes to attempts/<n>/.
    resume.set_aside_previous_attempt(summary.sweep_dir)
    run = wandb_log.start(logger_cfg, summary.sweep_dir, group=group, name="summary", job_type="summary",
                          config={"sweep_dir": str(summary.sweep_dir), "baseline_job": summary.baseline.num,
                                  "jobs": len(summary.jobs)},
                          tags=["summary"])
    if run is None:
        return None
    table = summary.table.astype(object).where(summary.table.notna(), None)  # NaN -> null in the table
    # Images from the PNG files: a raw matplotlib figure would need plotly, which is not installed.
    run.log({"summary": wandb.Table(dataframe=table),
             "memory": wandb.Image(str(summary.sweep_dir / "memory.png")),
             "tradeoff": wandb.Image(str(summary.sweep_dir / "tradeoff.png"))})
    counts = {s.replace(" ", "_"): sum(j.status == s for j in summary.jobs) for s in {j.status for j in summary.jobs}}
    run_dir = Path(run.dir).parent  # run.dir is its files/ folder
    wandb_log.finish(run, {f"jobs.{k}": v for k, v in counts.items()})
    return run_dir


def latest_sweep(root: Path = Path("multirun")) -> Path | None:
    dirs = sorted(p.parent for p in root.glob(f"*/*/{sweepdir.MULTIRUN_FILE}"))
    return dirs[-1] if dirs else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memsweep.sweep.report", description=__doc__.split("\n")[0])
    parser.add_argument("sweep_dir", nargs="?", default="", help="the sweep's directory, e.g. multirun/<date>/<time>")
    parser.add_argument("--baseline", default=None,
                        help="job number or overrides (default: the sweep's report.baseline, else the first job)")
    parser.add_argument("--wandb", action="store_true",
                        help="also log a job_type=summary W&B run in the sweep's group (e.g. for an interrupted sweep)")
    args = parser.parse_args(argv)
    if not args.sweep_dir:
        hint = latest_sweep()
        print("memsweep report: error: no sweep dir given; usage: make report SWEEP=multirun/<date>/<time>"
              + (f" (latest: {hint})" if hint else ""), file=sys.stderr)
        return 2
    sweep_dir = Path(args.sweep_dir)
    baseline = args.baseline
    if baseline is None:
        baseline = sweepdir.multirun_value(sweep_dir, "report.baseline")
    try:
        summary = build(sweep_dir, baseline)
    except ReportError as exc:
        print(f"memsweep report: error: {exc}", file=sys.stderr)
        return 2
    paths = write(summary)
    print(summary.markdown)
    print("written: " + ", ".join(str(p) for p in paths.values()))
    if args.wandb:
        from ..config.schema import LoggerConf

        # the sweep's own project/entity/tags; asked for explicitly, so logged even if the sweep had logger=none
        saved = sweepdir.multirun_value(sweep_dir, "logger")
        logger_cfg = OmegaConf.merge(OmegaConf.structured(LoggerConf), saved or {}, {"name": "wandb"})
        group = sweepdir.group_of(sweep_dir, summary.jobs)
        print(f"W&B summary run (group {group}): {log_to_wandb(summary, logger_cfg, group)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
